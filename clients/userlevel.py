"""A node's part in a central user-level round (``privacy = "user"``, ``server.userlevel``).

Only with ``allow-central-user`` in its policy: the node then trusts the server with its
clipped model delta, which leaves without noise, and with adding the noise the server names.
It books ``participant_event(z)`` (the round's cost to its records, for the z the server
says it adds) under the round's entry *before* training, as every release, then trains
with the plain local plan (no per-example clipping or noise), clips its whole delta to S
and sends it with the bit 1[‖Δ‖ ≤ S] for adaptive clipping. A z below the policy's
``min-user-noise-multiplier`` (a count-only round's σ_b below half of it) is refused first. In a count-only round
(``count-only``, adaptive clipping's warm-up) it books ``count_participant_event(σ_b)``
and sends the bit alone: the delta never leaves the node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from clients.release import Account, Booked, ReleaseKind, reply
from clients.task import OfRound, loss_function, node_data, read_node_round, received_model, training_seed
from fedpriv.federation import protocol, userlevel
from fedpriv.federation.policy import NodePolicy, Randomness
from fedpriv.federation.userlevel_steps import clipped_delta, sent_delta
from fedpriv.node import checked_policy
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.userlevel import count_participant_event, participant_event
from fedpriv.training import TrainingPlan, default_device, train_round


@dataclass(frozen=True)
class UserRound(OfRound):
    """A user-level TRAIN as the node read and checked it, before anything is booked."""

    plan: TrainingPlan
    clip: float
    noise_multiplier: float
    model: torch.nn.Module
    before: dict[str, torch.Tensor]

    @property
    def entry(self) -> str:
        return protocol.train_entry(self.node.run_key, self.node.server_round)


def read_user_round(msg: Message, context: Context) -> UserRound:
    """The round's plan (without per-example clipping or noise), S, z and the received model,
    every check that needs no booking done (δ against N included)."""
    node = read_node_round(msg, context)
    plan = protocol.read_plan(node.config).non_private()
    clip, noise_multiplier = userlevel.read_user_round(node.config)
    model = received_model(msg, plan.model, node.settings)  # checked before anything is booked
    before = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    return UserRound(node, plan, clip, noise_multiplier, model, before)


def trained_delta(request: UserRound, ordinal: int) -> tuple[dict[str, np.ndarray], int]:
    """Train the received model with the plain local plan (after booking: ``ordinal`` is
    the booking's), and return its delta clipped to S and the bit (``userlevel_steps.clipped_delta``)."""
    node, policy = request.node, request.node.policy
    data = node_data(node.settings, node.context, policy, model=request.plan.model)
    train_round(
        request.model, data.features, data.labels, request.plan,
        seed=training_seed(policy, node.context.run_id, ordinal), client=int(request.account.client),
        round_=node.server_round, device=default_device(), secure=policy.randomness is Randomness.SECURE,
        num_examples=node.num_examples, fit_physical_batch=True, loss_fn=loss_function(node.settings),
    )
    return clipped_delta(request.before, request.model.cpu().state_dict(), request.clip)


def delta_record(deltas: dict[str, np.ndarray], before: dict[str, torch.Tensor]) -> ArrayRecord:
    """Float64 ``deltas`` cast to the dtypes of the model ``before`` (``sent_delta``), as a record."""
    return ArrayRecord({name: Array(d) for name, d in sent_delta(deltas, before).items()})


def check_noise_floor(policy: NodePolicy, noise_multiplier: float, count_noise: float | None) -> None:
    """``ProtocolError`` where the server names less noise than the node's
    ``min-user-noise-multiplier`` accepts: z below it, or (count-only) σ_b below half of it."""
    floor = policy.min_user_noise_multiplier
    if floor is None:
        return
    if count_noise is None and noise_multiplier < floor:
        raise protocol.ProtocolError(f"user-noise-multiplier {noise_multiplier:g} is below this node's "
                                     f"min-user-noise-multiplier {floor:g}")
    if count_noise is not None and count_noise < floor / 2:
        raise protocol.ProtocolError(f"clip-count-noise {count_noise:g} is below half this node's "
                                     f"min-user-noise-multiplier {floor:g}")


@dataclass(frozen=True)
class CentralRound:
    """A central user-level round as parsed: the round, and σ_b where it is count-only."""

    user: UserRound
    count_noise: float | None

    @property
    def account(self) -> Account:
        return self.user.account


def parse_central(msg: Message, context: Context) -> tuple[CentralRound, Charge]:
    """A round the node's policy allows (``allow-central-user``), with no less noise than its
    floor, charged ``participant_event(z)`` (count-only: ``count_participant_event(σ_b)``)."""
    if not checked_policy(context.node_config).allow_central_user:
        raise protocol.ProtocolError("this node's policy does not send un-noised updates to a server that adds "
                                     "the noise (allow-central-user = false)")
    user = read_user_round(msg, context)
    count_noise = userlevel.read_count_only(user.node.config)
    check_noise_floor(user.node.policy, user.noise_multiplier, count_noise)
    event = participant_event(user.noise_multiplier) if count_noise is None else count_participant_event(count_noise)
    return CentralRound(user, count_noise), Charge(user.entry, (event,))


def compute_central(request: CentralRound, booked: Booked) -> RecordDict:
    """Train, and send the clipped delta and its bit (the bit alone in a count-only round)."""
    deltas, under = trained_delta(request.user, booked.ordinal)
    released = {} if request.count_noise is not None else {protocol.ARRAYS: delta_record(deltas, request.user.before)}
    return RecordDict({**released, userlevel.USER: MetricRecord({userlevel.UNDER_CLIP: under})})


CENTRAL = ReleaseKind(parse_central, compute_central)


def train(msg: Message, context: Context) -> RecordDict:
    """Book the round, train on the received model, reply with the clipped delta and its bit
    (the bit alone in a count-only round)."""
    return reply(CENTRAL, msg, context)
