"""An example whose gradient is not finite adds exactly nothing, in every gradient path.

Otherwise one NaN makes the noisy sum NaN whatever σ, and a server that picks weights under
which one record's gradient is NaN learns from the update's finiteness whether that record
was in a lot (a membership oracle).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import build, generators, make_data
from torch import nn

from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.dpsgd.clipping import clip_factors
from fedpriv.dpsgd.engine import clipped_sum_function
from fedpriv.dpsgd.modules import trainable_parameters
from fedpriv.dpsgd.per_example import per_example_gradients
from fedpriv.dpsgd.sampling import poisson_lot
from fedpriv.training import TrainingPlan, train_round

MODES = ["vmap", "bookkeeping"]
BAD = [3, 7]  # example 3 holds a NaN input, example 7 a +Inf one


def poisoned_data(n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = make_data(n)
    x[3, 0, 1, 2] = math.nan
    x[7, 0, 0, 0] = math.inf
    return x, y


def clipped_sum(model, x, y, cfg):
    """(Σ_i clip(g_i) per tensor, returned loss sum) through the engine's chosen path."""
    params = trainable_parameters(model)
    sums = [torch.zeros_like(p) for p in params.values()]
    with clipped_sum_function(model, params, F.cross_entropy, cfg) as fn:
        loss = fn(x, y, sums)
    return sums, loss


@pytest.mark.parametrize("max_grad_norm", [0.1, math.inf])
@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["mlp", "cnn", "sequence"])
def test_an_example_with_a_non_finite_gradient_adds_exactly_nothing(name, mode, clipping, max_grad_norm):
    """mlp: Linear on (B, in) (the outer-product rule) and GroupNorm; cnn: Conv2d (channels
    last); sequence: Linear on (B, T, in) and a layer that never runs."""
    model = build(name)
    x, y = poisoned_data()
    grads, losses = per_example_gradients(model, trainable_parameters(model), x, y, F.cross_entropy)
    finite = torch.stack([g.flatten(1).isfinite().all(1) for g in grads.values()]).all(0)
    assert finite.tolist() == [i not in BAD for i in range(len(x))]  # the test bites
    cfg = DPSGDConfig(0.0, max_grad_norm, 0.1, clipping=clipping, grad_sample_mode=mode)
    got, got_loss = clipped_sum(model, x, y, cfg)
    want, _ = clipped_sum(model, x[finite], y[finite], cfg)
    for g, w in zip(got, want):
        assert g.isfinite().all()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    # The returned loss leaves out the non-finite losses only.
    torch.testing.assert_close(got_loss, losses[losses.isfinite()].sum())


@pytest.mark.parametrize("mode", MODES)
def test_a_batch_of_only_non_finite_examples_adds_zero(mode):
    model = build("cnn")
    x, y = make_data(4)
    x[:, 0, 0, 0] = torch.tensor([math.nan, math.inf, -math.inf, math.nan])
    got, loss = clipped_sum(model, x, y, DPSGDConfig(0.0, 1.0, 0.1, grad_sample_mode=mode))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in got)
    assert loss.item() == 0.0


def test_clip_factors_drop_non_finite_examples_from_every_tensor():
    sq_norms = [torch.tensor([1.0, math.nan, 4.0, 0.25]), torch.tensor([1.0, 1.0, math.inf, 0.25])]
    for clipping in ("flat", "per_layer"):
        factors, keep = clip_factors(sq_norms, 1.0, DPSGDConfig(1.0, 1.0, 0.1, clipping=clipping).clipping)
        assert keep.tolist() == [True, False, False, True]
        for f in factors:
            assert f.isfinite().all() and f[1] == 0 and f[2] == 0 and f[0] > 0 and f[3] > 0
    factors, keep = clip_factors([torch.tensor([1.0, 2.0])], 1.0, DPSGDConfig(1.0, 1.0, 0.1).clipping)
    assert keep is None  # all finite: the fast path, no mask, no copies


# The curious server: weights under which the target's logits overflow to ±inf (so its
# loss and gradient are NaN) while every other example's logits stay finite.
TARGET, N = 5, 16


def server_model_and_data() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    x, y = make_data(N)
    x[:, 0, 0, 0] = 0.0
    x[TARGET, 0, 0, 0] = 10.0  # a feature only the target has
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    with torch.no_grad():
        model[1].weight[:, 0] = torch.tensor([3e38, -3e38, 0.0])
    grads, _ = per_example_gradients(model, trainable_parameters(model), x, y, F.cross_entropy)
    finite = torch.stack([g.flatten(1).isfinite().all(1) for g in grads.values()]).all(0)
    assert finite.tolist() == [i != TARGET for i in range(N)]
    return model, x, y


@pytest.mark.parametrize("mode", MODES)
def test_the_update_is_finite_whether_or_not_the_target_was_sampled(mode):
    q, steps, runs = 0.5, 2, 20
    sampled = 0
    for seed in range(runs):
        model, x, y = server_model_and_data()
        gens = generators(sampling=100 + seed, noise=200 + seed)
        replay = torch.Generator().manual_seed(100 + seed)
        sampled += any(TARGET in poisson_lot(N, q, replay).tolist() for _ in range(steps))
        report = train_dpsgd(model, x, y, config=DPSGDConfig(1.0, 1.0, q, grad_sample_mode=mode), steps=steps,
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1), **gens)
        assert all(p.isfinite().all() for p in model.parameters()), f"seed {seed}"
        assert math.isfinite(report.mean_loss)
    assert 0 < sampled < runs  # the oracle had both answers to give


@pytest.mark.parametrize("secure", [False, True])
def test_train_round_updates_stay_finite_under_the_servers_weights(secure):
    plan = TrainingPlan(model="mlp", lot_size=N // 2, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.1)
    for seed in range(20):  # q = 0.5, 2 steps: the target is in some lot in 3/4 of the runs
        model, x, y = server_model_and_data()
        train_round(model, x, y, plan, seed=seed, client=0, round_=1, device="cpu", secure=secure)
        assert all(p.isfinite().all() for p in model.parameters()), f"seed {seed}"
