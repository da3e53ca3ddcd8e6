"""Functional-mechanism linear regression: sensitivities (Hypothesis, replace one record,
records outside the bounds included), the noise scale (KS test), the cost (closed form),
utility against scikit-learn's OLS at a large ε, and clear errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats
from sklearn.datasets import load_diabetes
from sklearn.linear_model import LinearRegression

from fedpriv.algorithms.linreg import Bounds, coefficients, fit, predict, privatise, sensitivities
from fedpriv.privacy import make_accountant

D = 3
BOUNDS = Bounds(np.full(D, -1.0), np.full(D, 2.0), (0.0, 10.0))
values = st.floats(-5.0, 5.0, allow_nan=False)  # reaches outside the bounds: clamped


@settings(max_examples=200, deadline=None)
@given(data=arrays(float, (6, D + 1), elements=values), other=arrays(float, D + 1, elements=values),
       row=st.integers(0, 5))
def test_replacing_one_record_moves_each_part_by_at_most_its_sensitivity(data, other, row):
    x, y = data[:, :D], data[:, D] * 2
    changed_x, changed_y = x.copy(), y.copy()
    changed_x[row], changed_y[row] = other[:D], other[D] * 2
    before, after = coefficients(x, y, BOUNDS), coefficients(changed_x, changed_y, BOUNDS)
    s_quad, s_lin = sensitivities(D)
    assert np.abs(before.quadratic - after.quadratic).sum() <= s_quad + 1e-9
    assert np.abs(before.linear - after.linear).sum() <= s_lin + 1e-9


def test_the_sensitivities_are_reached():
    # linear: y·x̃ = +1 everywhere against −1 everywhere moves each of the D sums by 4
    plus = coefficients(np.full((1, D), 2.0), np.array([10.0]), BOUNDS)
    minus = coefficients(np.full((1, D), 2.0), np.array([0.0]), BOUNDS)
    s_quad, s_lin = sensitivities(D)
    assert np.abs(plus.linear - minus.linear).sum() == pytest.approx(s_lin)
    # quadratic: one record's monomials add up to (Σ|x̃|)² = D², half the stated bound
    assert np.abs(plus.quadratic).sum() == pytest.approx(s_quad / 2)


def test_noise_has_the_stated_scale_on_each_part():
    x, y = np.zeros((4, D)), np.ones(4)
    exact = coefficients(x, y, BOUNDS)
    epsilon, share = 2.0, 0.75
    s_quad, s_lin = sensitivities(D)
    rng = np.random.default_rng(5)
    draws = [privatise(exact, D, epsilon, share, rng)[0] for _ in range(1500)]
    quad = np.concatenate([d.quadratic - exact.quadratic for d in draws])
    lin = np.concatenate([d.linear - exact.linear for d in draws])
    assert stats.kstest(quad, stats.laplace(scale=s_quad / (epsilon * share)).cdf).pvalue > 1e-3
    assert stats.kstest(lin, stats.laplace(scale=s_lin / (epsilon * (1 - share))).cdf).pvalue > 1e-3
    assert stats.kstest(lin, stats.laplace(scale=1.2 * s_lin / (epsilon * (1 - share))).cdf).pvalue < 1e-3


def test_one_fit_costs_epsilon():
    x, y = np.zeros((4, D)), np.ones(4)
    _, event = fit(x, y, BOUNDS, epsilon=0.7, rng=np.random.default_rng(0))
    assert make_accountant("basic").compose(event).epsilon(1e-5) == pytest.approx(0.7, rel=1e-6)


def test_at_a_large_epsilon_it_approaches_ordinary_least_squares():
    x, y = load_diabetes(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:353], order[353:]
    bounds = Bounds(np.full(x.shape[1], -0.2), np.full(x.shape[1], 0.2), (25.0, 346.0))
    ols = np.mean((LinearRegression().fit(x[train], y[train]).predict(x[test]) - y[test]) ** 2)
    private = np.mean([np.mean((predict(fit(x[train], y[train], bounds, 1e5, rng=np.random.default_rng(s))[0],
                                        x[test], bounds) - y[test]) ** 2) for s in range(3)])
    assert private < 1.05 * ols


@pytest.mark.parametrize("x, y, message", [  # NaN and ±∞ are clamped: tests/algorithms/test_nonfinite_records.py
    (np.zeros((2, 2)), np.zeros(2), "shape"),
])
def test_bad_records_are_clear_errors(x, y, message):
    with pytest.raises(ValueError, match=message):
        coefficients(x, y, BOUNDS)


def test_bad_bounds_are_clear_errors():
    with pytest.raises(ValueError, match="low < high"):
        Bounds(np.zeros(2), np.zeros(2), (0.0, 1.0))
    with pytest.raises(ValueError, match="target"):
        Bounds(np.zeros(2), np.ones(2), (1.0, 1.0))
