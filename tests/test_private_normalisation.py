"""Private data normalisation (``fedpriv.training.normalisation``) and the centralized run's
``--private-normalisation`` / ``--augmult``: the statistics' sensitivity, their cost
against a closed form and dp-accounting, and that the run books it."""

import math
from pathlib import Path

import dp_accounting
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from fedpriv.privacy import ComposedEvent, epsilon_of
from fedpriv.training.normalisation import normalisation_events, private_normalisation
from simulations import centralized


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at δ, exactly (Dong, Roth & Su 2019): δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    return brentq(lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta, 0, 100)


@pytest.mark.parametrize("sigma", [2.0, 8.0])
def test_the_normalisations_cost_is_two_gaussian_mechanisms(sigma):
    """Two Gaussian mechanisms of multiplier σ compose to √2/σ-GDP: PLD matches the closed
    form; dp-accounting's RDP, built here from its own events, bounds it from above."""
    events = ComposedEvent(normalisation_events(sigma))
    exact = _gaussian_epsilon(math.sqrt(2) / sigma, 1e-5)
    assert epsilon_of(events, 1e-5, "pld") == pytest.approx(exact, rel=0.01)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(sigma), 2)
    assert epsilon_of(events, 1e-5) == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-6)
    assert exact < rdp.get_epsilon(1e-5)


def test_one_example_moves_the_released_sums_by_at_most_the_bound():
    """Same noise (same seed), one outlier added: N·mean moves by ≤ bound (its clipped m_i)."""
    x = torch.rand(500, 3, 4, 4) * 0.2
    outlier = torch.full((1, 3, 4, 4), 1e6)
    released = []
    for data in (x, torch.cat([x, outlier])):
        stats = private_normalisation(data, 2.0, torch.Generator().manual_seed(0), bound=0.5)
        released.append(stats.mean.double() * len(data))
    assert (released[1] - released[0]).norm().item() == pytest.approx(0.5, rel=1e-4)


def test_normalised_inputs_have_about_zero_mean_and_unit_std_per_channel():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(20000, 3, 2, 2, generator=gen) * torch.tensor([0.05, 0.1, 0.2]).view(1, 3, 1, 1) + 0.1
    normalised = private_normalisation(x, 1.0, torch.Generator().manual_seed(2))(x)
    per_channel = normalised.transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(per_channel.mean(1), torch.zeros(3), atol=0.05, rtol=0)
    torch.testing.assert_close(per_channel.std(1), torch.ones(3), atol=0.05, rtol=0)


def test_secure_noise_needs_no_generator_and_refuses_a_zero_multiplier():
    x = torch.rand(50, 2, 3)
    assert private_normalisation(x, 5.0, None).std.shape == (2,)
    with pytest.raises(ValueError, match="noise_multiplier > 0"):
        private_normalisation(x, 0.0, None)


def _cli(shared: Path, *flags: str) -> list[str]:
    return ["--dataset", "mnist", "--model", "cnn", "--data-dir", str(shared), "--limit-train", "300",
            "--epochs", "1", "--lot-size", "100", "--noise-multiplier", "1.5", *flags]


def test_the_centralized_run_books_the_normalisation_and_augmult_keeps_epsilon(shared_data_dir: Path, capsys):
    plain = centralized.main(_cli(shared_data_dir))
    both = centralized.main(_cli(shared_data_dir, "--private-normalisation", "4", "--augmult", "2"))
    augmented = centralized.main(_cli(shared_data_dir, "--augmult", "2"))
    training = dp_accounting.PoissonSampledDpEvent(plain["sample_rate"], dp_accounting.GaussianDpEvent(1.5))
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.SelfComposedDpEvent(training, plain["steps"]))
    assert plain["epsilon"] == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-6)
    rdp.compose(dp_accounting.GaussianDpEvent(4.0), 2)
    assert both["epsilon"] == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-6)
    assert augmented["epsilon"] == plain["epsilon"] and augmented["augmult"] == 2
    assert len({plain["model_sha256"], augmented["model_sha256"], both["model_sha256"]}) == 3


def test_a_target_epsilon_covers_the_normalisation(shared_data_dir: Path, capsys):
    flags = ["--dataset", "mnist", "--model", "cnn", "--data-dir", str(shared_data_dir), "--limit-train", "300",
             "--epochs", "2", "--lot-size", "100", "--target-epsilon", "3"]
    plain = centralized.main(flags)
    normalised = centralized.main([*flags, "--private-normalisation", "3"])
    assert 2.9 < normalised["epsilon"] <= 3 and 2.9 < plain["epsilon"] <= 3
    assert normalised["noise_multiplier"] > plain["noise_multiplier"]  # training gets less of the budget


def test_augmult_scatters_each_shifted_copy_for_a_scattering_model():
    images = torch.rand(3, 1, 28, 28)
    augment = centralized.augmentation(2, "scatter_linear", images, normalise=None)(0)
    inputs = augment(images)
    assert inputs.shape == (6, *augment.input_shape) == (6, 81, 7, 7)
    assert not torch.equal(inputs[0], inputs[1])  # the first image shifted twice (seeded: two different offsets)
