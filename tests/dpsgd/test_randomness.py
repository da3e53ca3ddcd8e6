"""Statistical checks: noise scale, noise/sampling independence, lot sizes; seeded lots at
fixed seeds, secure (OS CSPRNG) lots with a stated false-failure probability."""

import math

import pytest
import torch
from conftest import build, generators, make_data
from scipy import stats

from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.dpsgd.sampling import micro_batches, poisson_lot, secure_poisson_lot


def zero_loss(outputs, targets):
    return 0.0 * outputs.sum()


def noise_only_update(sigma, C, q, seeds=(1, 2), steps=1, secure_mode=False):
    """Parameter change of SGD(lr=1) on a zero-gradient loss: exactly minus the noise / (qN)."""
    model = build("mlp")
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    x, y = make_data(40)
    train_dpsgd(model, x, y, config=DPSGDConfig(sigma, C, q, secure_mode=secure_mode), steps=steps,
                optimizer=torch.optim.SGD(model.parameters(), lr=1.0), loss_fn=zero_loss,
                **({} if secure_mode else generators(*seeds)))
    return before - torch.cat([p.detach().flatten() for p in model.parameters()]), q * len(x)


@pytest.mark.parametrize("secure_mode", [False, True])
def test_noise_is_gaussian_with_std_sigma_c_over_expected_lot(secure_mode):
    sigma, C, q = 1.7, 0.3, 0.25
    update, lot = noise_only_update(sigma, C, q, secure_mode=secure_mode)
    z = (update * lot / (sigma * C)).double().numpy()  # should be N(0, 1) draws
    assert len(z) > 200
    assert stats.kstest(z, "norm").pvalue > 0.001
    chi2 = (z**2).sum()  # variance test: χ² with len(z) degrees of freedom
    assert stats.chi2(len(z)).sf(chi2) > 0.0005 and stats.chi2(len(z)).cdf(chi2) > 0.0005


def test_noise_depends_on_the_noise_generator_only():
    base, _ = noise_only_update(1.0, 1.0, 0.25, seeds=(1, 2))
    other_sampling, _ = noise_only_update(1.0, 1.0, 0.25, seeds=(99, 2))
    other_noise, _ = noise_only_update(1.0, 1.0, 0.25, seeds=(1, 3))
    assert torch.equal(base, other_sampling)
    assert not torch.allclose(base, other_noise)


def test_poisson_lot_sizes_have_mean_qn():
    n, q, lots = 1000, 0.05, 400
    gen = torch.Generator().manual_seed(0)
    sizes = torch.tensor([poisson_lot(n, q, gen).numel() for _ in range(lots)], dtype=torch.float64)
    standard_error = (n * q * (1 - q) / lots) ** 0.5
    assert abs(sizes.mean().item() - n * q) < 4 * standard_error
    assert sizes.var().item() == pytest.approx(n * q * (1 - q), rel=0.25)  # binomial, not fixed


def test_lots_are_sorted_unique_and_split_without_loss():
    lot = poisson_lot(100, 0.5, torch.Generator().manual_seed(3))
    assert torch.equal(lot, torch.unique(lot))
    chunks = micro_batches(lot, 7)
    assert all(len(c) <= 7 for c in chunks) and torch.equal(torch.cat(chunks), lot)
    assert micro_batches(lot[:0], 7) == ()


# Secure lots cannot be seeded, so their tests are statistical.  Each check below is a
# two-sided z-test at 5σ or a test at p < 1e-7, so that a correct sampler fails this test
# with probability < 3e-6 (union bound; normal approximations at these sample sizes).
SECURE_N, SECURE_Q, SECURE_DRAWS = 250, 0.3, 4000
Z = 5.0


@pytest.fixture(scope="module")
def secure_lots() -> torch.Tensor:
    """(draws, N) inclusion indicators of independent secure lots."""
    hits = torch.zeros(SECURE_DRAWS, SECURE_N, dtype=torch.bool)
    for draw in range(SECURE_DRAWS):
        hits[draw, secure_poisson_lot(SECURE_N, SECURE_Q, "cpu")] = True
    return hits


def test_secure_lot_sizes_are_binomial(secure_lots):
    """Mean N·q and variance N·q(1−q) of Binomial(N, q); the variance also rules out a fixed
    lot size and correlated inclusions (it is the sum of all pairwise covariances)."""
    n, q, d = SECURE_N, SECURE_Q, SECURE_DRAWS
    sizes = secure_lots.sum(1).double()
    mean, var = n * q, n * q * (1 - q)
    assert abs(sizes.mean().item() - mean) < Z * math.sqrt(var / d)
    # Var of the sample variance ≈ (μ4 − σ⁴)/d, μ4 the binomial's fourth central moment.
    mu4 = var * (1 + 3 * (n - 2) * q * (1 - q))
    assert abs(sizes.var().item() - var) < Z * math.sqrt((mu4 - var**2) / d)


def test_each_example_joins_a_secure_lot_with_probability_q(secure_lots):
    """Per example, the number of lots it joined is Binomial(draws, q), independent across
    examples: every count within 6σ (Bonferroni over N: < 1e-6 in all), and their χ²."""
    q, d = SECURE_Q, SECURE_DRAWS
    counts = secure_lots.sum(0).double()
    z = (counts - d * q) / math.sqrt(d * q * (1 - q))
    assert z.abs().max().item() < 6.0
    chi2 = (z**2).sum().item()
    assert stats.chi2(SECURE_N).sf(chi2) > 1e-7 and stats.chi2(SECURE_N).cdf(chi2) > 1e-7


def test_secure_lots_are_sorted_distinct_on_the_device_and_differ_between_draws():
    first, second = secure_poisson_lot(1000, 0.5, "cpu"), secure_poisson_lot(1000, 0.5, "cpu")
    assert first.dtype == torch.int64 and first.device.type == "cpu"
    assert torch.equal(first, torch.unique(first)) and 0 <= first.min() and first.max() < 1000
    assert not torch.equal(first, second)  # equal with probability 2^-1000
    assert torch.equal(secure_poisson_lot(7, 1.0, "cpu"), torch.arange(7))
