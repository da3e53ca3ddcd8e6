"""The DP-SGD step captured in CUDA graphs (``fedpriv.dpsgd.static``) against the eager step,
on CUDA only (skipped elsewhere; ``benchmarks/gpu_check.sh`` runs it on a lent GPU): the same
privatised gradients and events, and every replay with noise of its own."""

import copy

import pytest
import torch
from conftest import build, make_data

from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.dpsgd.static import cached_static_sums
from fedpriv.models import build_model
from tests.dpsgd.recording import recording_sgd

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def _float32_exact():
    """TF32 off (cuDNN's is on by default): captured and eager compared in float32."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _generators(secure):
    if secure:
        return {}
    return {"sampling_generator": torch.Generator("cuda").manual_seed(1),
            "noise_generator": torch.Generator("cuda").manual_seed(2)}


def _captured(model):
    sums = cached_static_sums(model)
    return sums is not None and sums.padded and all(b.graph is not None for b in sums.buckets.values())


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
@pytest.mark.parametrize("model_name", ["mlp", "cnn", "zoo_cnn"])
def test_the_captured_step_gives_the_eager_steps_gradients_and_events(model_name, clipping):
    if model_name == "zoo_cnn":
        reference, data = build_model("cnn", seed=0), (torch.randn(60, 1, 28, 28), torch.randint(0, 10, (60,)))
    else:
        reference, data = build(model_name), make_data(60)
    reference, data = reference.cuda(), tuple(t.cuda() for t in data)
    config = DPSGDConfig(1.0, 0.4, 0.3, max_physical_batch_size=8, clipping=clipping)
    reports, grads = [], []
    for static in (False, True):
        model = copy.deepcopy(reference)
        optimizer, seen = recording_sgd(model, lr=0.5)
        for _ in range(2):  # the second call replays the first's graphs
            reports.append(train_dpsgd(model, *data, config=config, steps=4, optimizer=optimizer,
                                       static_shapes=static, **_generators(False)))
        grads.append(seen)
    assert _captured(model) and len(cached_static_sums(model).buckets) > 1
    assert reports[0].events == reports[2].events and reports[1].events == reports[3].events
    for eager, captured in zip(*grads, strict=True):
        torch.testing.assert_close(captured, eager, rtol=1e-4, atol=1e-5)
    assert reports[2].mean_loss == pytest.approx(reports[0].mean_loss, rel=1e-4)


@pytest.mark.parametrize("secure", [False, True])
def test_two_replays_of_a_captured_step_draw_independent_noise(secure):
    """lr = 0 keeps the parameters and q = 1 the lot, so every replay computes the same
    clipped sum: consecutive gradients differ by their noise alone, N(0, 2σ²C²)/N² per
    entry, which a graph that re-used one draw would make exactly zero.  Unseeded in secure
    mode: the std of ~270 entries is within 20 % of its value but for ≈ 5 of its standard
    errors (family-wise α < 1e-5 over the 6 comparisons)."""
    model = build("mlp").cuda()
    x, y = (t.cuda() for t in make_data(20))
    sigma, clip = 2.0, 0.5
    config = DPSGDConfig(sigma, clip, 1.0, max_physical_batch_size=32, secure_mode=secure)
    optimizer, seen = recording_sgd(model, lr=0.0)
    for _ in range(2):
        train_dpsgd(model, x, y, config=config, steps=2, optimizer=optimizer, **_generators(secure))
    assert _captured(model)
    for first, second in zip(seen, seen[1:]):
        difference = (second - first) * 20
        assert difference.std().item() == pytest.approx(2 ** 0.5 * sigma * clip, rel=0.2)
