"""Augmentation multiplicity (``fedpriv.dpsgd.augmentation``): each example's gradient is the
mean of its copies' gradients, clipped as one, and the privacy event is that of K = 1."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import build, generators, make_data

from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.dpsgd.augmentation import Augmentation, random_shift
from fedpriv.dpsgd.engine import clipped_sum_function, gradient_buffers, spent_events
from fedpriv.dpsgd.modules import trainable_parameters
from fedpriv.models import build_model


def _reference_clipped_sum(model, x, y, k, clip):
    """Σ_i clip_C(mean_k ∇ℓ(x_ik, y_i)), one autograd.grad per copy, in float64."""
    model = copy.deepcopy(model).double()
    params = list(trainable_parameters(model).values())
    total = [torch.zeros_like(p) for p in params]
    for i in range(len(y)):
        rows = x[i * k:(i + 1) * k].double()
        per_copy = [torch.autograd.grad(F.cross_entropy(model(rows[j:j + 1]), y[i:i + 1]), params,
                                        materialize_grads=True) for j in range(k)]
        mean = [sum(g[t] for g in per_copy) / k for t in range(len(params))]
        norm = torch.sqrt(sum(g.square().sum() for g in mean))
        for t, g in zip(total, mean, strict=True):
            t += g * min(1.0, clip / norm.item())
    return torch.cat([t.flatten() for t in total]).float()


@pytest.mark.parametrize("mode", ["bookkeeping", "vmap"])
@pytest.mark.parametrize("model_name", ["mlp", "cnn", "sequence", "zoo_mlp"])
def test_each_examples_gradient_is_the_mean_over_its_copies_clipped_as_one(model_name, mode):
    k, batch = 3, 5
    if model_name == "zoo_mlp":
        model = build_model("mlp", seed=0, in_features=16, hidden=8)
    else:
        model = build(model_name)
    x, y = make_data(batch * k)
    y = y[:batch]
    params = trainable_parameters(model)
    clip = 0.5 * float(_reference_clipped_sum(model, x, y, k, float("inf")).norm()) / batch  # about half clipped
    config = DPSGDConfig(1.0, clip, 0.5, grad_sample_mode=mode)
    with clipped_sum_function(model, params, F.cross_entropy, config) as clipped_sum:
        flat, into = gradient_buffers(params)
        flat.zero_()
        loss = clipped_sum(x, y, into)
    torch.testing.assert_close(flat, _reference_clipped_sum(model, x, y, k, clip), rtol=1e-4, atol=1e-6)
    expected_loss = sum(F.cross_entropy(model(x[i * k:(i + 1) * k]), y[i].expand(k)) for i in range(batch))
    torch.testing.assert_close(loss, expected_loss.detach(), rtol=1e-5, atol=1e-6)


def _identity(examples, generator):
    return examples


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_identical_copies_train_as_one_and_the_event_is_unchanged(model_name):
    """K identical copies average to the example's own gradient: the run of K = 1."""
    data = make_data(40)
    config = DPSGDConfig(1.0, 0.5, 0.25, max_physical_batch_size=4)
    models, reports = [build(model_name), build(model_name)], []
    for model, k in zip(models, (1, 3), strict=True):
        augment = Augmentation(k, _identity, torch.Generator().manual_seed(3), tuple(data[0].shape[1:]))
        reports.append(train_dpsgd(model, *data, config=config, steps=3, optimizer=torch.optim.SGD(
            model.parameters(), lr=0.5), augment=augment, **generators()))
    assert reports[0].events == reports[1].events == spent_events(config, 3)
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert reports[1].mean_loss == pytest.approx(reports[0].mean_loss, rel=1e-5)


def test_random_shift_moves_each_image_by_its_own_offset_within_the_bound():
    images = torch.zeros(200, 1, 9, 9)
    images[:, 0, 4, 4] = torch.arange(1, 201, dtype=torch.float32)
    shifted = random_shift(2)(images, torch.Generator().manual_seed(0))
    assert shifted.shape == images.shape
    where = [torch.nonzero(s[0]) for s in shifted]
    assert all(len(w) == 1 for w in where)  # the pixel is still inside (|offset| <= 2 < 4)
    assert all(s[0][tuple(w[0])].item() == i + 1 for i, (s, w) in enumerate(zip(shifted, where, strict=True)))
    offsets = {tuple((w[0] - 4).tolist()) for w in where}
    assert offsets == {(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}  # all 25, and no other



@pytest.mark.parametrize("k", [1, 3])
def test_a_multi_output_regression_examples_gradient_is_the_mean_over_its_copies(k):
    """An example's (2,)-shaped float target is repeated for each of its K copies (it was
    expanded as if it were a class label, which fails for any target of more than one
    value), so the gradient equals autograd's of the mean loss over that example's copies."""
    from fedpriv.dpsgd.per_example import per_example_gradients

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(4 * k, 3), torch.randn(4, 2)
    grads, _ = per_example_gradients(model, trainable_parameters(model), x, y, F.mse_loss)
    for i in range(4):
        model.zero_grad()
        F.mse_loss(model(x[k * i:k * i + k]), y[i].expand(k, 2)).backward()
        torch.testing.assert_close(grads["weight"][i], model.weight.grad)
        torch.testing.assert_close(grads["bias"][i], model.bias.grad)
