"""Per-example gradients, clipping, and the book-keeping path against the vmap reference."""

import copy
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from conftest import build, make_data

from fedpriv.dpsgd import DPSGDConfig, GradSampleMode, UnsupportedModuleError
from fedpriv.dpsgd.bookkeeping import bookkeeping_clipped_sum, supports_bookkeeping
from fedpriv.dpsgd.clipping import clip_factors, squared_norms
from fedpriv.dpsgd.engine import resolve_grad_sample_mode
from fedpriv.dpsgd.modules import trainable_parameters
from fedpriv.dpsgd.per_example import per_example_gradients, vmap_clipped_sum


def clipped_sums(clipped_sum, params, x, y):
    """Call a ``ClippedSumFn`` on contiguous zero buffers, as the engine's (whatever the
    parameters' memory format): (Σ_i clip(g_i) per tensor, Σ_i loss_i)."""
    sums = [p.new_zeros(p.shape) for p in params.values()]
    return sums, clipped_sum(x, y, sums)


def vmap_sums(model, params, x, y, cfg):
    clipped_sum = partial(vmap_clipped_sum, model, params, loss_fn=F.cross_entropy, config=cfg)
    return clipped_sums(clipped_sum, params, x, y)


def loop_gradients(model, x, y):
    """The definition: one backward per example."""
    grads = []
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()])
    return [torch.stack(g) for g in zip(*grads)]


@pytest.mark.parametrize("name", ["mlp", "cnn", "sequence"])
def test_per_example_gradients_equal_a_per_sample_loop(name):
    model = build(name)
    x, y = make_data(9)
    grads, losses = per_example_gradients(model, trainable_parameters(model), x, y, F.cross_entropy)
    for got, want in zip(grads.values(), loop_gradients(model, x, y)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses, F.cross_entropy(model(x), y, reduction="none"))


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_every_clipped_gradient_is_within_the_bound(name, clipping):
    model, C = build(name), 0.05
    x, y = make_data(32)
    grads, _ = per_example_gradients(model, trainable_parameters(model), 10 * x, y, F.cross_entropy)
    grads = list(grads.values())
    mode = DPSGDConfig(1, C, 0.1, clipping=clipping).clipping
    factors, keep = clip_factors([squared_norms(g) for g in grads], C, mode)
    assert keep is None  # all finite: nothing dropped, nothing copied
    clipped = [f.view(-1, *[1] * (g.dim() - 1)) * g for f, g in zip(factors, grads)]
    per_tensor = torch.stack([squared_norms(g).sqrt() for g in clipped])  # (K, B)
    assert per_tensor.pow(2).sum(0).sqrt().max() <= C * (1 + 1e-5)
    assert per_tensor.pow(2).sum(0).sqrt().max() >= 0.5 * C  # the bound is reached, not just respected
    if clipping == "per_layer":
        assert per_tensor.max() <= C / math.sqrt(len(grads)) * (1 + 1e-5)


def test_small_gradients_are_not_rescaled():
    norms = [torch.tensor([0.04, 9.0])]
    (factors,), _ = clip_factors(norms, 1.0, DPSGDConfig(1, 1.0, 0.1).clipping)
    assert factors[0] == 1.0 and factors[1] == pytest.approx(1 / 3)


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "sequence"])
@pytest.mark.parametrize("max_grad_norm", [0.1, math.inf])
def test_bookkeeping_path_equals_the_vmap_path(name, clipping, max_grad_norm):
    model = build(name)
    assert supports_bookkeeping(model)
    params = trainable_parameters(model)
    x, y = make_data(40)
    cfg = DPSGDConfig(0.0, max_grad_norm, 0.1, clipping=clipping)
    want, want_loss = vmap_sums(model, params, x, y, cfg)
    with bookkeeping_clipped_sum(model, params, F.cross_entropy, cfg) as clipped_sum:
        got, got_loss = clipped_sums(clipped_sum, params, x, y)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got_loss, want_loss)
    assert all(p.grad is None for p in model.parameters())
    assert not model._forward_hooks and not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize(
    "conv",
    [
        torch.nn.Conv2d(1, 3, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(2, 2)),
        torch.nn.Conv2d(1, 2, 2, bias=False),
    ],
)
def test_bookkeeping_conv_geometry_matches_vmap(conv):
    """Rectangular kernels, strides, padding and dilation; a conv without bias."""
    torch.manual_seed(0)
    width = conv(torch.zeros(1, 1, 4, 4)).numel()
    model = torch.nn.Sequential(conv, torch.nn.Tanh(), torch.nn.Flatten(), torch.nn.Linear(width, 3))
    x, y = make_data(12)
    assert_bookkeeping_equals_vmap(model, x, y, DPSGDConfig(0.0, 0.1, 0.1), atol=1e-6)


def test_tied_or_unsupported_layers_fall_back_to_vmap():
    tied = build("mlp")
    tied.add_module("again", tied[1])
    assert not supports_bookkeeping(tied)
    assert not supports_bookkeeping(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LayerNorm(16)))


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_same_clipped_per_example_gradients_as_opacus():
    grad_sample = pytest.importorskip("opacus.grad_sample")
    model, C = build("cnn"), 0.05
    x, y = make_data(16)
    mine = list(per_example_gradients(model, trainable_parameters(model), x, y, F.cross_entropy)[0].values())
    wrapped = grad_sample.GradSampleModule(build("cnn"), loss_reduction="sum")
    F.cross_entropy(wrapped(x), y, reduction="sum").backward()
    theirs = [p.grad_sample for p in wrapped.parameters()]
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # Opacus' DPOptimizer clip factor: min(1, C / (‖g_i‖ + 1e-6)) from the flat norm.
    opacus_norm = torch.stack([g.flatten(1).norm(dim=1) for g in theirs]).norm(dim=0)
    opacus_factor = (C / (opacus_norm + 1e-6)).clamp(max=1.0)
    (factor, *_), _ = clip_factors([squared_norms(g) for g in mine], C, DPSGDConfig(1, C, 0.1).clipping)
    torch.testing.assert_close(factor, opacus_factor, rtol=1e-4, atol=0)


@pytest.mark.parametrize("name", ["mlp", "cnn", "cifar_cnn", "scatter_linear"])
def test_project_models_take_the_bookkeeping_path_and_match_vmap(name):
    models = pytest.importorskip("fedpriv.models")
    model = models.build_model(name, seed=0)
    shape = {"cifar_cnn": (3, 32, 32), "scatter_linear": (81, 7, 7)}.get(name, (1, 28, 28))
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, *shape, generator=gen), torch.randint(0, 10, (5,), generator=gen)
    cfg = DPSGDConfig(1.0, 0.01, 0.1)
    assert resolve_grad_sample_mode(model, cfg) is GradSampleMode.BOOKKEEPING
    assert_bookkeeping_equals_vmap(model, x, y, cfg, atol=1e-7)


def nchw_and_channels_last(model, x):
    """(model, x) in both memory formats: the channels_last pair made from the NCHW one."""
    nchw = copy.deepcopy(model).to(memory_format=torch.contiguous_format)
    channels_last = copy.deepcopy(model).to(memory_format=torch.channels_last)
    return (nchw, x.contiguous()), (channels_last, x.contiguous(memory_format=torch.channels_last))


@pytest.mark.parametrize("mode", ["bookkeeping", "vmap"])
@pytest.mark.parametrize("name", ["zoo_cnn", "rgb_cnn"])
def test_channels_last_gives_the_clipped_sums_of_nchw(name, mode):
    """Per-example weight gradients (patches + bmm, or vmap) do not depend on the layout:
    the project's CNN (channels_last, conv inputs unpadded after a pool) and a padded
    convolution on three-channel channels_last inputs."""
    if name == "zoo_cnn":
        model, shape = pytest.importorskip("fedpriv.models").build_model("cnn", seed=0), (1, 28, 28)
    else:
        model, shape = build(name), (3, 7, 7)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, *shape, generator=gen), torch.randint(0, 3, (6,), generator=gen)
    cfg = DPSGDConfig(0.0, 0.01, 0.1, grad_sample_mode=mode)
    results = []
    for layout, inputs in nchw_and_channels_last(model, x):
        params = trainable_parameters(layout)
        if mode == "vmap":
            results.append(vmap_sums(layout, params, inputs, y, cfg))
            continue
        with bookkeeping_clipped_sum(layout, params, F.cross_entropy, cfg) as clipped_sum:
            results.append(clipped_sums(clipped_sum, params, inputs, y))
    (want, want_loss), (got, got_loss) = results
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_loss, want_loss)


def assert_bookkeeping_equals_vmap(model, x, y, cfg, atol):
    params = trainable_parameters(model)
    want, _ = vmap_sums(model, params, x, y, cfg)
    with bookkeeping_clipped_sum(model, params, F.cross_entropy, cfg) as clipped_sum:
        got, _ = clipped_sums(clipped_sum, params, x, y)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=atol)


def test_auto_mode_falls_back_to_vmap_and_bookkeeping_refuses_what_it_cannot_do():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    assert resolve_grad_sample_mode(model, DPSGDConfig(1.0, 1.0, 0.1)) is GradSampleMode.VMAP
    cfg = DPSGDConfig(1.0, 1.0, 0.1, grad_sample_mode="bookkeeping")
    with pytest.raises(UnsupportedModuleError, match="vmap"):
        with bookkeeping_clipped_sum(model, trainable_parameters(model), F.cross_entropy, cfg):
            pass


class Recurrent(torch.nn.Module):
    """One registered layer applied twice: tied use that only shows at run time."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.cell(torch.tanh(self.cell(x.flatten(1))))))


def test_a_layer_run_twice_is_refused_by_bookkeeping_and_fine_with_vmap():
    model, (x, y) = Recurrent(), make_data(4)
    shared = torch.nn.Sequential(torch.nn.Flatten(), model.cell, torch.nn.Tanh(), model.cell)
    assert not supports_bookkeeping(shared)  # registered twice: caught before running
    cfg = DPSGDConfig(1.0, 1.0, 0.1, grad_sample_mode="bookkeeping")
    params = trainable_parameters(model)
    with bookkeeping_clipped_sum(model, params, F.cross_entropy, cfg) as clipped_sum:
        with pytest.raises(UnsupportedModuleError, match="twice"):
            clipped_sums(clipped_sum, params, x, y)
    grads, _ = per_example_gradients(model, trainable_parameters(model), x, y, F.cross_entropy)
    for got, want in zip(grads.values(), loop_gradients(model, x, y)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
