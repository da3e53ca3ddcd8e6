"""Statistical checks at fixed seeds: noise scale, noise/sampling independence, lot sizes."""

import pytest
import torch
from conftest import build, generators, make_data
from scipy import stats

from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.dpsgd.sampling import micro_batches, poisson_lot


def zero_loss(outputs, targets):
    return 0.0 * outputs.sum()


def noise_only_update(sigma, C, q, seeds=(1, 2), steps=1, secure_mode=False):
    """Parameter change of SGD(lr=1) on a zero-gradient loss: exactly minus the noise / (qN)."""
    model = build("mlp")
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    x, y = make_data(40)
    train_dpsgd(model, x, y, config=DPSGDConfig(sigma, C, q, secure_mode=secure_mode), steps=steps,
                optimizer=torch.optim.SGD(model.parameters(), lr=1.0), loss_fn=zero_loss,
                **generators(*seeds))
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
