"""Utility of the classic algorithms approaches the non-private result as ε grows, within
the tolerances stated in docs/classic.md (mean of 3 seeds, the command's own code path);
and federating them changes the noise, never the ε a record is charged."""

import numpy as np
import pytest
from scipy import stats

from fedpriv.algorithms import linreg
from fedpriv.algorithms.datasets import load
from simulations.classic import centralized, nonprivate, stated_bounds
from tests.algorithms.test_classic_federated import _grid, _spent

pytestmark = pytest.mark.usefixtures("task_identity")
SEEDS = range(3)
TOLERANCE_AT_10 = {  # how far from non-private the mean may be at ε = 10 (docs/classic.md)
    "linreg": ("ratio", 2.0),  # test MSE at most twice ordinary least squares'
    "kmeans-dplloyd": ("gap", 0.25),  # clustering accuracy at most 0.25 below Lloyd's
    "kmeans-input": ("gap", 0.35),  # local DP: every record noised at its source
    "ann-iris": ("gap", 0.10),
    "output-perturbation": ("gap", 0.06),
}


def _mean(algorithm: str, epsilon: float) -> float:
    return float(np.mean([centralized(algorithm, epsilon, seed, 3)[0] for seed in SEEDS]))


@pytest.mark.parametrize("algorithm", sorted(TOLERANCE_AT_10))
def test_utility_at_epsilon_10_is_within_the_stated_tolerance_and_better_than_at_0_1(algorithm):
    kind, tolerance = TOLERANCE_AT_10[algorithm]
    reference = float(np.mean([nonprivate(algorithm, seed) for seed in SEEDS]))
    at_10, at_0_1 = _mean(algorithm, 10.0), _mean(algorithm, 0.1)
    if kind == "ratio":  # an error: lower is better
        assert at_10 <= tolerance * reference and at_10 < at_0_1
    else:
        assert at_10 >= reference - tolerance and at_10 > at_0_1


def test_federated_release_is_the_exact_sum_plus_one_laplace_per_node(tmp_path, monkeypatch):
    """K nodes each charge their records ε, as centralized does; without secure aggregation
    each share carries its own Laplace(b), so the sum's noise is that of K of them (variance
    K·2b²), not the centralized Laplace(b): a KS test for each, on the quadratic sums."""
    from server.classic.loops import federated_linreg

    clients, runs, epsilon = 3, 60, 1.0
    bounds = stated_bounds("linreg")
    summed = []
    monkeypatch.setattr(linreg, "solve", lambda noisy, d, scale: summed.append(noisy.quadratic) or np.zeros(d + 1))
    grid = _grid(tmp_path, clients, budget=epsilon * runs * 1.01)
    for _ in range(runs):
        federated_linreg(grid, "diabetes", 0, epsilon, bounds)
    x, y, _, _ = load("diabetes", 0)
    noise = (np.array(summed) - linreg.coefficients(x, y, bounds).quadratic).ravel()
    assert all(_spent(tmp_path, c) == (runs, pytest.approx(runs * epsilon, rel=1e-6)) for c in range(clients))
    b = linreg.sensitivities(10)[0] / (epsilon * 0.5)
    rng = np.random.default_rng(0)
    k_sums = rng.laplace(scale=b, size=(200_000, clients)).sum(axis=1)
    assert stats.ks_2samp(noise, k_sums).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=b).cdf).pvalue < 1e-6
