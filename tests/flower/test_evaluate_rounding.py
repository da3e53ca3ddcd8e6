"""A node's EVALUATE release against the floating-point attack (Mironov 2012): the curious
server knows the two neighbouring inputs and asks, of each released value y, whether the
other input could have produced it. With float noise (y = x + n in doubles) it could not,
for many y near 0: a certain answer. Every release must now be an integer (the loss sum a
lattice point), reachable from either input, and booked as the discrete Gaussian it is."""

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from fedpriv.federation.policy import LOSS_CLIP, LOSS_STEPS, NodePolicy, PolicyError, Randomness
from fedpriv.federation.releases import noisy_evaluation
from fedpriv.privacy import AccountantKind, epsilon_of
from fedpriv.privacy.accountants.rdp import ORDERS

RELEASES = 150  # per input; today's float noise at s = 1 gave away ~38 % of them (|y| < 1/2)


def _could_come_from(y: float, x: float) -> bool:
    """The attacker's rounding check: is there a double n with fl(x + n) = y? (x + n is
    monotone in n, so the doubles next to y − x decide.)"""
    n = y - x
    return any(x + m == y for m in (n, math.nextafter(n, -math.inf), math.nextafter(n, math.inf)))


def _model() -> torch.nn.Module:
    """Predicts class 0 with a finite loss on any record."""
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(torch.tensor([2.0, 0.0, 0.0]))
    return model


@pytest.mark.parametrize("randomness", [Randomness.SECURE, Randomness.SEEDED])
def test_the_rounding_check_tells_no_release_from_its_neighbours(tmp_path, randomness):
    seeded = {"seed": 3} if randomness is Randomness.SEEDED else {}
    policy = NodePolicy(epsilon_budget=math.inf, state_dir=tmp_path, allow_evaluate=True, evaluate_noise=1.0,
                        randomness=randomness, **seeded)
    model, record = _model(), torch.zeros(1, 4)
    loss = float(torch.nn.functional.cross_entropy(model(record), torch.tensor([0])).detach())
    snapped = round(loss * LOSS_STEPS / LOSS_CLIP) * LOSS_CLIP / LOSS_STEPS  # the attacker knows the lattice
    inputs = {"empty": (torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), (0.0, 0.0, 0.0)),
              "one record": (record, torch.tensor([0]), (1.0, 1.0, snapped))}
    told, releases = 0, []
    for name, (features, labels, exact) in inputs.items():
        other = next(v[2] for k, v in inputs.items() if k != name)
        for i in range(RELEASES):
            out = noisy_evaluation(model, features, labels, policy, name, i)
            released = (out["count"], out["correct"], out["loss-sum"])
            assert all(_could_come_from(y, x) for y, x in zip(released, exact, strict=True))
            told += not all(_could_come_from(y, x) for y, x in zip(released, other, strict=True))
            releases.append(released)
    assert told == 0, f"the rounding check told {told} of {2 * RELEASES} releases from their neighbour"
    steps = np.array(releases) / np.array([1.0, 1.0, LOSS_CLIP / LOSS_STEPS])
    np.testing.assert_array_equal(steps, np.round(steps))  # integers: counts and loss steps


def test_seeded_releases_repeat_and_differ_by_path(tmp_path):
    policy = NodePolicy(epsilon_budget=math.inf, state_dir=tmp_path, evaluate_noise=5.0,
                        randomness=Randomness.SEEDED, seed=1)
    data = torch.zeros(3, 4), torch.zeros(3, dtype=torch.long)
    first = noisy_evaluation(_model(), *data, policy, 1, 0)
    assert first == noisy_evaluation(_model(), *data, policy, 1, 0)
    assert first != noisy_evaluation(_model(), *data, policy, 1, 1)


@pytest.mark.parametrize("noise", [0.5, 3.0, 20.0])
def test_an_evaluation_books_the_discrete_gaussians_closed_form(tmp_path, noise):
    # Canonne, Kamath & Steinke 2020, Thm 14: N_Z noise s·u_j on integers each moved by <= u_j
    # is RDP α·d/(2s²) (d = 3), the Gaussian's at multiplier s/√3: dp-accounting's curve
    event = NodePolicy(epsilon_budget=1.0, state_dir=tmp_path, evaluate_noise=noise).evaluate_event()
    reference = RdpAccountant(orders=list(ORDERS)).compose(dp_accounting.GaussianDpEvent(noise / math.sqrt(3)))
    for delta in (1e-5, 1e-8):
        assert epsilon_of(event, delta, "rdp") == pytest.approx(reference.get_epsilon(delta), rel=1e-9)
        assert epsilon_of(event, delta, "zcdp") == pytest.approx(
            3 / (2 * noise**2) + 2 * math.sqrt(3 / (2 * noise**2) * math.log(1 / delta)), rel=1e-9)


@pytest.mark.parametrize("bad", [{"accountant": AccountantKind.PLD}, {"accountant": AccountantKind.BASIC},
                                 {"evaluate_noise": 2.0**21}])
def test_an_evaluation_no_sampler_or_accountant_can_take_is_refused_by_the_policy(tmp_path, bad):
    with pytest.raises(PolicyError):
        NodePolicy(epsilon_budget=1.0, state_dir=tmp_path, allow_evaluate=True, **bad)


@pytest.mark.parametrize("loss_clip", [1e-3, LOSS_CLIP, 2.0**20])
@pytest.mark.parametrize("worst", [math.inf, math.nan, -1e30, 1e30])
def test_one_record_of_a_tasks_own_loss_moves_the_release_by_at_most_its_units(tmp_path, loss_clip, worst):
    """A task's own loss (any values, here a record's loss set to ``worst``) under any bound the
    request names: one record added moves (count, correct, loss sum) by at most (1, 1, L), the
    ``EVALUATE_UNITS`` the booked event prices (in steps of L / LOSS_STEPS, so the same event
    covers every L). The same seed and path draw the same noise for both inputs, so the
    differences are the mechanism's input differences exactly."""
    policy = NodePolicy(epsilon_budget=math.inf, state_dir=tmp_path, allow_evaluate=True, evaluate_noise=1.0,
                        randomness=Randomness.SEEDED, seed=5)
    features = torch.arange(6, dtype=torch.float32).reshape(6, 1)

    def scores(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        losses = torch.where(targets == 99, torch.tensor(worst), targets * 0.37)  # the added record: worst
        return losses, targets > 0

    model = torch.nn.Linear(1, 1)
    without = noisy_evaluation(model, features[:5], features[:5, 0], policy, "n", scores=scores, loss_clip=loss_clip)
    added = torch.cat([features[:5, 0], torch.tensor([99.0])])
    with_it = noisy_evaluation(model, features, added, policy, "n", scores=scores, loss_clip=loss_clip)
    assert with_it["count"] - without["count"] == 1 and with_it["correct"] - without["correct"] == 1
    assert 0 <= with_it["loss-sum"] - without["loss-sum"] <= loss_clip * (1 + 1e-12)
    if not worst < 0:  # +∞, NaN and large losses count as the bound; a negative one as 0
        assert with_it["loss-sum"] - without["loss-sum"] == pytest.approx(loss_clip)
