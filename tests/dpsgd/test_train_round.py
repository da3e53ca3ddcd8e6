"""fedpriv.training.train_round: the public size ñ it plans for, and its secure randomness."""

import dataclasses
import math

import pytest
import torch
from conftest import make_data

from fedpriv.models import build_model, model_sha256
from fedpriv.training import TrainingPlan, train_round

PLAN = TrainingPlan(model="mlp", lot_size=8, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.1, momentum=0.0)


def data(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = make_data(n)
    return torch.nn.functional.interpolate(x, size=(28, 28)), y  # the MLP's MNIST shape


def trained(plan=PLAN, **kwargs):
    model = build_model(plan.model, seed=0)
    report = train_round(model, *data(), plan, seed=3, client=0, round_=1, device="cpu", **kwargs)
    return model, report


def test_num_examples_none_is_the_data_set_size():
    (a, report_a), (b, report_b) = trained(), trained(num_examples=32)
    assert model_sha256(a) == model_sha256(b)
    assert report_a.events == report_b.events == PLAN.round_events(32)


def test_q_steps_and_events_follow_the_released_size():
    released = 50  # ñ ≠ N = 32
    _, report = trained(num_examples=released)
    assert report.events == PLAN.round_events(released) != PLAN.round_events(32)
    assert report.steps == PLAN.steps_per_round(released) == round(released / PLAN.lot_size)


def test_the_divisor_is_q_times_the_released_size():
    """q = 1 (one full lot), σ = 0, C = ∞: the step is −lr·Σ_i g_i / ñ."""
    plan = dataclasses.replace(PLAN.non_private(), shared_sample_rate=1.0)
    before = torch.cat([p.detach().flatten() for p in build_model("mlp", seed=0).parameters()])

    def update(released):
        model, report = trained(plan, num_examples=released)
        assert report.steps == 1
        return before - torch.cat([p.detach().flatten() for p in model.parameters()])

    torch.testing.assert_close(update(64), update(32) / 2, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("bad", [0, -3, True, 32.0])
def test_num_examples_is_validated(bad):
    with pytest.raises(ValueError, match="num_examples"):
        trained(num_examples=bad)


def test_secure_rounds_ignore_the_seed_and_report_the_planned_events():
    """σ = 0 as well: with no noise the lots alone make the two runs differ."""
    for plan in (PLAN, PLAN.non_private()):
        (a, report), (b, _) = trained(plan, secure=True), trained(plan, secure=True)
        assert model_sha256(a) != model_sha256(b)
        assert report.events == plan.round_events(32)
        assert all(math.isfinite(p.abs().max().item()) for p in a.parameters())
