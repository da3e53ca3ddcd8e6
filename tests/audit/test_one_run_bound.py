"""The one-run bound and Clopper–Pearson intervals against independent references: closed
forms, scipy's exact binomial intervals, and the coverage of an exactly ε-DP mechanism."""

import math

import numpy as np
import pytest
from scipy import stats

from fedpriv.audit.clopper_pearson import epsilon_from_counts, lower_bound, upper_bound
from fedpriv.audit.one_run import best_guesses, epsilon_lower_bound, p_value, score_guesses


def test_all_guesses_right_without_delta_is_the_closed_form():
    # δ = 0, v = r: P[W ≥ r] = p^r with p = e^ε/(1 + e^ε); the bound solves p^r = 0.05
    for r in (10, 100, 400):
        p = 0.05 ** (1 / r)
        assert epsilon_lower_bound(1000, r, r, 0.0, 0.95) == pytest.approx(math.log(p / (1 - p)), abs=1e-5)


def _theorem(m, r, v, eps, delta):
    # Theorem 5.2 written out term by term with exact binomial sums (math.comb)
    p = math.exp(eps) / (1 + math.exp(eps))
    f = lambda u: sum(math.comb(r, j) * p**j * (1 - p) ** (r - j) for j in range(max(u, 0), r + 1))  # noqa: E731
    return min(1.0, f(v) + 2 * m * delta * max((f(v - i) - f(v)) / i for i in range(1, v + 1)))


@pytest.mark.parametrize(("m", "r", "v", "eps", "delta"), [(100, 40, 33, 1.0, 1e-3), (50, 50, 45, 2.0, 1e-5),
                                                           (200, 20, 12, 0.3, 1e-2)])
def test_p_value_is_the_theorem(m, r, v, eps, delta):
    assert p_value(m, r, v, eps, delta) == pytest.approx(_theorem(m, r, v, eps, delta), rel=1e-9)


def test_bound_holds_at_its_confidence_for_an_exactly_dp_mechanism():
    # Randomised response on each canary's coin is exactly ε-DP per canary: its scores are
    # the coin flipped with probability 1/(1 + e^ε). The 95 % bound may exceed ε in ≤ 5 %
    # of audits (binomial slack for 60 audits); it must also see some ε (power).
    eps, m, rng = 1.0, 1000, np.random.default_rng(3)
    bounds = []
    for _ in range(60):
        coins = rng.random(m) < 0.5
        keep = rng.random(m) < math.exp(eps) / (1 + math.exp(eps))
        scores = np.where(keep, coins, ~coins) + rng.random(m) * 0.1
        bounds.append(best_guesses(scores, coins, 0.0, pairs=[(250, 250)]).epsilon_lower_bound)
    assert sum(b > eps for b in bounds) <= 7
    assert np.median(bounds) > 0.5 * eps


def test_guesses_break_ties_by_position_not_by_coins():
    coins = np.array([True, False, True, False])
    guess = score_guesses(np.zeros(4), coins, 1, 1)  # all tied: in = last, out = first
    assert guess.correct == int(coins[-1]) + int(not coins[0])


def test_clopper_pearson_is_scipys_exact_interval():
    for k, n in ((0, 50), (7, 50), (50, 50), (312, 1000)):
        ci = stats.binomtest(k, n).proportion_ci(0.9, method="exact")  # two-sided 90 % = one-sided 95 % each
        assert lower_bound(k, n, 0.05) == pytest.approx(ci.low, abs=1e-12)
        assert upper_bound(k, n, 0.05) == pytest.approx(ci.high, abs=1e-12)


def test_epsilon_from_counts():
    low, high = lower_bound(800, 1000, 0.025), upper_bound(100, 1000, 0.025)
    assert epsilon_from_counts(800, 100, 1000, 0.0, 0.95) == pytest.approx(math.log(low / high))
    assert epsilon_from_counts(500, 500, 1000, 0.0, 0.95) == 0.0
