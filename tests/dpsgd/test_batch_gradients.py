"""The batch-gradient path of the non-private schedule (σ = 0, C = ∞): the same model as the
per-example paths (same lots, optimizer, divisor), non-finite examples still dropped, and
never reachable when a config has noise or clipping."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import build, generators, make_data

from fedpriv.dpsgd import DPSGDConfig, engine, train_dpsgd
from fedpriv.dpsgd.batch import batch_gradient_sum, is_plain
from fedpriv.dpsgd.modules import trainable_parameters
from fedpriv.dpsgd.per_example import per_example_gradients
from fedpriv.models import build_model


def train(model, data, mode, steps=4, sample_rate=0.3, physical_batch=512, noise_multiplier=0.0,
          max_grad_norm=math.inf):
    """``steps`` steps of momentum SGD through ``mode``'s gradient path; the final parameters."""
    config = DPSGDConfig(noise_multiplier, max_grad_norm, sample_rate, max_physical_batch_size=physical_batch,
                         grad_sample_mode=mode)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    train_dpsgd(model, *data, config=config, steps=steps, optimizer=optimizer, **generators())
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("reference", ["vmap", "bookkeeping"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "sequence", "rgb_cnn"])
@pytest.mark.parametrize("physical_batch", [3, 512])
def test_the_batch_path_gives_the_per_example_paths_model(name, reference, physical_batch):
    x, y = make_data(40)
    if name == "rgb_cnn":
        x = torch.randn(40, 3, 7, 7, generator=torch.Generator().manual_seed(3))
    got = train(build(name), (x, y), "auto", physical_batch=physical_batch)
    want = train(build(name), (x, y), reference, physical_batch=physical_batch)
    assert not torch.equal(got, torch.cat([p.detach().flatten() for p in build(name).parameters()]))  # it moved
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_mnist_cnn_channels_last_matches_too():
    """The user-level runs' model (``cnn``, channels_last) on MNIST-shaped inputs."""
    gen = torch.Generator().manual_seed(5)
    x, y = torch.rand(30, 1, 28, 28, generator=gen), torch.randint(0, 10, (30,), generator=gen)
    got = train(build_model("cnn", 0), (x, y), "auto", steps=3, sample_rate=0.4)
    want = train(build_model("cnn", 0), (x, y), "vmap", steps=3, sample_rate=0.4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_non_finite_example_still_adds_nothing():
    """A NaN input: the batch gradient is NaN, the micro-batch goes to the per-example path,
    which drops that example only and sums the finite losses (as ``test_nonfinite``
    requires of every path); without it, the batch path's own sums are the same."""
    model = build("cnn")
    x, y = make_data(12)
    x[5, 0, 1, 2] = math.nan
    params = trainable_parameters(model)
    config = DPSGDConfig(0.0, math.inf, 0.1)
    sums = [torch.zeros_like(p) for p in params.values()]
    keep = torch.arange(12) != 5
    clean = [torch.zeros_like(p) for p in params.values()]
    with engine.clipped_sum_function(model, params, F.cross_entropy, config) as fn:
        loss = fn(x, y, sums)
        clean_loss = fn(x[keep], y[keep], clean)
    grads, losses = per_example_gradients(model, params, x[keep], y[keep], F.cross_entropy)
    for got, also, want in zip(sums, clean, grads.values(), strict=True):
        assert got.isfinite().all()
        torch.testing.assert_close(got, want.sum(0), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(also, want.sum(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, losses.sum())  # the finite losses only
    torch.testing.assert_close(clean_loss, losses.sum())


class Spy:
    """Counts the engine's calls for a batch-gradient function (then builds the real one)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return batch_gradient_sum(*args, **kwargs)


@pytest.mark.parametrize("mode", ["auto", "vmap", "bookkeeping"])
@pytest.mark.parametrize(("sigma", "clip"), [(1.0, 0.5), (0.0, 0.5), (1e-9, 10.0)])
def test_a_config_with_noise_or_clipping_never_takes_the_batch_path(monkeypatch, mode, sigma, clip):
    """Privacy first: per-example clipping and noise are never replaced by a batch gradient."""
    spy = Spy()
    monkeypatch.setattr(engine, "batch_gradient_sum", spy)
    train(build("cnn"), make_data(20), "auto", steps=2)
    assert spy.calls == 1  # the test bites: the plain schedule does take it
    train(build("cnn"), make_data(20), mode, steps=2, noise_multiplier=sigma, max_grad_norm=clip)
    assert spy.calls == 1


@pytest.mark.parametrize(("sigma", "clip"), [(1.0, 0.5), (0.0, 0.5)])
def test_the_batch_path_refuses_a_private_config(sigma, clip):
    model = build("mlp")
    with pytest.raises(ValueError, match="non-private schedule only"):
        batch_gradient_sum(model, trainable_parameters(model), F.cross_entropy, DPSGDConfig(sigma, clip, 0.5),
                           per_example=lambda *a: torch.zeros(()))
    assert not is_plain(DPSGDConfig(sigma, clip, 0.5))
