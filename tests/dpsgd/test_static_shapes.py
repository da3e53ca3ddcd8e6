"""Fixed-shape micro-batches (``fedpriv.dpsgd.static``), on the CPU: padding to a bucket
changes neither the clipped sum nor the loss nor the events, and a padded row adds exactly
zero whatever it holds. The same code is what a CUDA graph captures (tests/dpsgd/test_cuda_graphs.py)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import build, generators, make_data

from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.dpsgd.engine import clipped_sum_function, gradient_buffers
from fedpriv.dpsgd.modules import trainable_parameters
from fedpriv.dpsgd.static import bucket_size, cached_static_sums
from tests.dpsgd.recording import recording_sgd


def test_a_bucket_holds_the_batch_with_at_most_an_eighth_of_padding_and_never_exceeds_the_physical_batch():
    for max_size in (1, 7, 100, 4096):
        for n in range(1, max_size + 1):
            size = bucket_size(n, max_size)
            assert n <= size <= min(max_size, n + n // 8)
    assert len({bucket_size(n, 10**6) for n in range(3584, 4609)}) == 4  # a lot of 4096 ± 512: 4 graphs


@pytest.mark.parametrize("mode", ["bookkeeping", "vmap"])
@pytest.mark.parametrize("model_name", ["mlp", "cnn", "sequence"])
def test_masked_rows_add_exactly_zero_even_when_their_gradients_are_nan(model_name, mode):
    model = build(model_name)
    params = trainable_parameters(model)
    x, y = make_data(12)
    x[0] = float("nan")  # the padding example: NaN gradient and loss
    config = DPSGDConfig(1.0, 0.3, 0.5, grad_sample_mode=mode)
    real = torch.arange(5, 12)
    padded = torch.cat([real, torch.zeros(5, dtype=torch.long)])
    mask = torch.arange(12) < len(real)
    with clipped_sum_function(model, params, F.cross_entropy, config) as clipped_sum:
        flat_eager, eager = gradient_buffers(params)
        flat_eager.zero_()
        loss_eager = clipped_sum(x[real], y[real], eager)
        flat_masked, masked = gradient_buffers(params)
        flat_masked.zero_()
        loss_masked = clipped_sum(x[padded], y[padded], masked, mask)
        flat_pad, only_padding = gradient_buffers(params)
        flat_pad.copy_(torch.randn(flat_pad.shape))
        before = flat_pad.clone()
        loss_pad = clipped_sum(x[padded], y[padded], only_padding, torch.zeros(12, dtype=torch.bool))
    torch.testing.assert_close(flat_masked, flat_eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss_masked, loss_eager)
    assert torch.equal(flat_pad, before) and loss_pad.item() == 0.0


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_static_shapes_train_like_the_eager_engine(model_name, clipping):
    """Poisson lots of varying size over micro-batches of 8 (several buckets, last ones
    padded): the same privatised gradients step by step, the same events and loss."""
    data = make_data(50)
    config = DPSGDConfig(1.0, 0.4, 0.3, max_physical_batch_size=8, clipping=clipping)
    reports, grads = [], []
    reference = build(model_name)
    for static in (False, True):
        model = copy.deepcopy(reference)
        optimizer, seen = recording_sgd(model, lr=0.5)
        for _ in range(2):  # a second call reuses the first's StaticSums
            reports.append(train_dpsgd(model, *data, config=config, steps=3, optimizer=optimizer,
                                       static_shapes=static, **generators()))
        grads.append(seen)
    assert len(cached_static_sums(model).buckets) > 1
    assert reports[0].events == reports[2].events and reports[1].events == reports[3].events
    for eager, static in zip(*grads, strict=True):
        torch.testing.assert_close(static, eager, rtol=1e-5, atol=1e-6)
    assert reports[2].mean_loss == pytest.approx(reports[0].mean_loss, rel=1e-5)


def test_every_step_of_a_static_run_draws_its_own_noise():
    """lr = 0 keeps the parameters, so the clipped sums repeat: two steps' gradients differ by
    their noise alone, which a re-used draw would make zero."""
    model = build("mlp")
    optimizer, seen = recording_sgd(model, lr=0.0)
    config = DPSGDConfig(2.0, 0.5, 1.0, max_physical_batch_size=16)
    train_dpsgd(model, *make_data(20), config=config, steps=2, optimizer=optimizer, static_shapes=True, **generators())
    difference = (seen[1] - seen[0]) * 20  # the noise's difference, N(0, 2σ²C²) per entry
    assert difference.std().item() == pytest.approx(2 ** 0.5 * 2.0 * 0.5, rel=0.2)


def test_a_call_with_another_loss_does_not_reuse_the_static_sums():
    """The kept StaticSums (on CUDA: graphs that computed one loss) serve only the same loss:
    a second call with another ``loss_fn`` on the same model and tensors gets its own."""
    model = build("mlp")
    data = make_data(20)
    config = DPSGDConfig(1.0, 0.5, 1.0, max_physical_batch_size=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_dpsgd(model, *data, config=config, steps=1, optimizer=optimizer, static_shapes=True, **generators())
    first = cached_static_sums(model)
    train_dpsgd(model, *data, config=config, steps=1, optimizer=optimizer, static_shapes=True, **generators())
    assert cached_static_sums(model) is first  # same loss, tensors and settings: reused
    train_dpsgd(model, *data, config=config, steps=1, optimizer=optimizer, static_shapes=True,
                loss_fn=lambda o, t: F.cross_entropy(o, t), **generators())
    assert cached_static_sums(model) is not first
