"""The distributed discrete Gaussian as a Gaussian's post-processing (up to a factor e^{±η}):
on a fine lattice its booked ε is dp-accounting's Poisson-sampled Gaussian at
z = √(n·s² − r²)/Δ₂, so one client (or many) reproduces the centralized run's ε; and the two
lemmas the argument rests on, checked numerically on small parameters where their errors are
large enough to see."""

import math

import dp_accounting
import numpy as np
import pytest

from fedpriv.privacy import distributed_dpsgd_event, dpsgd_event, epsilon_of
from fedpriv.privacy.accountants.distributed import KERNEL_PARAMETER, distributed_rdp, gaussian_equivalent
from fedpriv.privacy.events import DistributedDiscreteGaussianEvent

Q, STEPS, DELTA = 4096 / 60000, 600, 1e-5


@pytest.mark.parametrize("shares", [1, 10, 100])
def test_a_fine_lattice_books_exactly_the_subsampled_gaussian_of_its_effective_noise(shares):
    clip, sensitivity, sigma = 4096.0, 4096.0 * 1.0006, 3.0
    share = sigma * clip / math.sqrt(shares)
    event = distributed_dpsgd_event(share, shares, sensitivity, 39_700, Q, STEPS)
    z = math.sqrt(shares * share * share - KERNEL_PARAMETER**2) / sensitivity
    reference = dp_accounting.rdp.RdpAccountant()
    reference.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(z)), STEPS))
    assert epsilon_of(event, DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-3)
    # the centralized run at σ: the lattice's inflation (and r) are the only difference
    centralized = epsilon_of(dpsgd_event(sigma, Q, STEPS), DELTA)
    assert centralized <= epsilon_of(event, DELTA) <= centralized * 1.002


def test_a_coarse_lattice_has_no_gaussian_equivalent_and_falls_back_to_the_general_bound():
    coarse = DistributedDiscreteGaussianEvent(0.9, 2, 1.0, 10)  # n·s² = 1.62 <= r² = 4
    z, eta = gaussian_equivalent(coarse)
    assert eta == math.inf
    orders = np.array([2.0, 8.0, 32.0])
    assert np.isfinite(distributed_rdp(coarse, 0.1, orders)).all()


def _discrete_gaussian(parameter_squared, support):
    weights = np.exp(-support.astype(float) ** 2 / (2 * parameter_squared))
    return weights / weights.sum()


def test_lemma_1_a_sum_of_discrete_gaussians_is_one_up_to_the_bound():
    """s = 0.8, n = 3: the exact pmf of the sum (convolutions) against N_Z(0, 3s²); the
    largest log-ratio is positive (the sum is *not* a discrete Gaussian) and within the bound."""
    s2, shares, support = 0.64, 3, np.arange(-40, 41)
    share = _discrete_gaussian(s2, support)
    total = share
    for _ in range(shares - 1):
        total = np.convolve(total, share)
    wide = np.arange(-40 * shares, 40 * shares + 1)
    middle = np.abs(wide) <= 12  # where both pmfs are far from float's floor
    ratio = np.log(total[middle] / _discrete_gaussian(shares * s2, wide)[middle])
    e = [2 * sum(math.exp(-2 * math.pi**2 * s2 * t * t * m / (m + 1)) for t in range(1, 60))
         for m in range(1, shares)]
    big_e = math.prod(1 + x for x in e) - 1
    bound = math.log((1 + big_e) / (1 - big_e))
    assert 0 < np.abs(ratio).max() <= bound


def test_lemma_2_a_discrete_gaussian_is_a_rounded_gaussian_up_to_the_bound():
    """K_r(N(0, v)) with r = 0.6 (ε_r ≈ 3e-3: visible), by numerical integration, against
    N_Z(0, v + r²): within [(1−ε_r)/(1+ε_r), (1+ε_r)/(1−ε_r)] on every k."""
    r2, v = 0.36, 4.0
    y = np.linspace(-40, 40, 400_001)
    dy = y[1] - y[0]
    density = np.exp(-y * y / (2 * v)) / math.sqrt(2 * math.pi * v)
    js = np.arange(-60, 61)
    normaliser = np.exp(-(js[:, None] - y[None, :]) ** 2 / (2 * r2)).sum(0)
    support = np.arange(-12, 13)
    kernel = np.exp(-(support[:, None] - y[None, :]) ** 2 / (2 * r2)) / normaliser
    rounded = (kernel * density).sum(1) * dy
    ratio = np.log(rounded / _discrete_gaussian(v + r2, np.arange(-60, 61))[48:73])
    eps_r = 2 * sum(math.exp(-2 * math.pi**2 * r2 * t * t) for t in range(1, 60))
    bound = math.log((1 + eps_r) / (1 - eps_r))
    assert 1e-7 < np.abs(ratio).max() <= bound
    # the variances add: against N_Z(0, v) alone the same outputs are far outside the bound
    assert np.abs(np.log(rounded / _discrete_gaussian(v, np.arange(-60, 61))[48:73])).max() > 100 * bound
