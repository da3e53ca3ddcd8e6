"""Both discrete Gaussian samplers against the exact pmf P(x) ∝ exp(−x²/(2σ²)), normalised
over ±(30σ + 30): a χ² goodness-of-fit test, the mean and the pmf's own variance (below σ²
for small σ).  The seeded sampler is tested at fixed seeds; the OpenDP one (OS CSPRNG) is
not reproducible: its checks fail a correct sampler with probability < 10⁻⁵ (χ² at p < 10⁻⁷,
moments at 5 standard errors, per σ)."""

import math

import numpy as np
import pytest
from scipy import stats

from fedpriv.distributed.noise import MAX_STDDEV, discrete_gaussian

SIGMAS = (0.5, 3.0, 40.0)
Z = 5.0


def exact_pmf(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    half = math.ceil(30 * sigma) + 30
    support = np.arange(-half, half + 1)
    weights = np.exp(-(support.astype(np.float64) ** 2) / (2 * sigma**2))
    return support, weights / weights.sum()


def chi_square_pvalue(draws: np.ndarray, sigma: float) -> float:
    """χ² over the integers whose expected count is ≥ 5, each tail lumped into its nearest such bin."""
    support, pmf = exact_pmf(sigma)
    assert support[0] <= draws.min() and draws.max() <= support[-1]
    observed = np.bincount(draws - support[0], minlength=len(support)).astype(np.float64)
    expected = pmf * len(draws)
    core = np.flatnonzero(expected >= 5)
    low, high = core[0], core[-1] + 1
    observed_bins, expected_bins = observed[low:high].copy(), expected[low:high].copy()
    for bins, full in ((observed_bins, observed), (expected_bins, expected)):
        bins[0] += full[:low].sum()
        bins[-1] += full[high:].sum()
    return stats.chisquare(observed_bins, expected_bins).pvalue


def check_moments(draws: np.ndarray, sigma: float) -> None:
    support, pmf = exact_pmf(sigma)
    variance = float((support.astype(np.float64) ** 2 * pmf).sum())
    fourth = float((support.astype(np.float64) ** 4 * pmf).sum())
    n = len(draws)
    assert abs(draws.mean()) < Z * math.sqrt(variance / n)
    assert abs(draws.astype(np.float64).var() - variance) < Z * math.sqrt((fourth - variance**2) / n)


@pytest.mark.parametrize("sigma", SIGMAS)
def test_the_seeded_sampler_draws_the_discrete_gaussian(sigma):
    draws = discrete_gaussian(sigma, 400_000, np.random.default_rng(2024))
    assert draws.dtype == np.int64
    assert chi_square_pvalue(draws, sigma) > 1e-4
    check_moments(draws, sigma)


@pytest.mark.parametrize("sigma", SIGMAS)
def test_the_opendp_sampler_draws_the_discrete_gaussian(sigma):
    draws = discrete_gaussian(sigma, 60_000, None)
    assert draws.dtype == np.int64
    assert chi_square_pvalue(draws, sigma) > 1e-7
    check_moments(draws, sigma)


def test_the_goodness_of_fit_test_tells_a_rounded_gaussian_apart():
    sigma = 0.5
    rounded = np.rint(np.random.default_rng(0).normal(0, sigma, 400_000)).astype(np.int64)
    assert chi_square_pvalue(rounded, sigma) < 1e-12


def test_the_small_sigma_variance_is_below_sigma_squared():
    support, pmf = exact_pmf(0.5)
    assert float((support**2 * pmf).sum()) == pytest.approx(0.2146, abs=1e-3)  # not 0.25


def test_the_seeded_sampler_is_reproducible_from_its_seed_alone():
    first = discrete_gaussian(7.3, 5000, np.random.default_rng(11))
    assert np.array_equal(first, discrete_gaussian(7.3, 5000, np.random.default_rng(11)))
    assert not np.array_equal(first, discrete_gaussian(7.3, 5000, np.random.default_rng(12)))


def test_opendp_draws_are_not_reproducible_and_use_64_bit_integers():
    # OpenDP's Python int is i32, whose sampler saturates at ±(2³¹ − 1): at σ = 2³³ a draw
    # lands within ±2³¹ with probability 0.2, so 50 draws all there would be 0.2⁵⁰
    draws = discrete_gaussian(2.0**33, 50, None)
    assert np.abs(draws).max() > 2**31 and not np.isin(draws, [2**31 - 1, -(2**31 - 1)]).any()
    assert not np.array_equal(discrete_gaussian(3.0, 100, None), discrete_gaussian(3.0, 100, None))


@pytest.mark.parametrize("generator", [None, np.random.default_rng(0)])
def test_zero_stddev_is_zeros_and_out_of_range_is_refused(generator):
    assert np.array_equal(discrete_gaussian(0.0, 4, generator), np.zeros(4, dtype=np.int64))
    assert discrete_gaussian(2.0, 0, generator).shape == (0,)
    for bad in (-1.0, math.nan, math.inf, 2 * MAX_STDDEV, True):
        with pytest.raises(ValueError, match="stddev"):
            discrete_gaussian(bad, 3, generator)
    with pytest.raises(ValueError, match="size"):
        discrete_gaussian(1.0, -1, generator)
