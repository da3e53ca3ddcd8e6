"""A node's part in a distributed user-level round (``privacy = "user"``, ``user-noise =
"distributed"``; ``server.userlevel_distributed``).

The round is a secure sum (``clients.distributed.train``: only with ``allow-distributed``;
the cohort, survivor and threshold checks of the node's own policy). The node does *not*
trust the server with its delta nor with the noise, so ``allow-central-user`` is not needed.
When its masked vector is due (``contribute``), it:

- sizes its discrete Gaussian share for the honest survivors its policy guarantees,
  n = ``policy.honest_shares`` (never the server's cohort or population): s = z·S·scale/√n,
  so that n honest shares alone carry z·S·scale;
- books ``distributed_participant_event(s, n, Δ₂, d)`` (its records' view: a record changed
  moves the encoded delta by ≤ 2Δ₂) in its durable ledger before it trains;
- trains with the plain local plan, clips its whole model delta to S, encodes it on the
  lattice exactly as a distributed DP-SGD step encodes a clipped example
  (``fedpriv.distributed.contribution.rounded_sum``) and adds its share mod 2^bits
  (``noised_vector``). The delta is flattened in the model's ``state_dict`` order.

With adaptive clipping (the round names ``clip-count-noise`` σ_b) the vector has one more
coordinate, (2b − 1)·k (``fedpriv.privacy.userlevel.count_scale``), the share is sized on
z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) and the booked sensitivity is 2√(Δ₂² + k²).

In a count-only round (``count-only``, adaptive clipping's warm-up) the vector is the bit
alone, (2b − 1)·k for k = ``COUNT_ONLY_SCALE``, plus a share of ``count_share_stddev``(σ_b,
n), booked ``distributed_count_participant_event``: the delta never leaves the node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict

from clients.distributed import encoding_settings, read_encoding, round_generators
from clients.release import Account, Booked, ReleaseKind
from clients.secure_sum import ContributionKind, contribution
from clients.userlevel import UserRound, read_user_round, trained_delta
from fedpriv.distributed.contribution import noised_vector, rounded_sum
from fedpriv.distributed.lattice import Lattice
from fedpriv.federation import protocol, userlevel
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.userlevel import (
    COUNT_ONLY_SCALE,
    count_scale,
    count_share_stddev,
    delta_noise_multiplier,
    distributed_count_participant_event,
    distributed_participant_event,
)
from fedpriv.secagg.node import StageInfo, Vector


@dataclass(frozen=True)
class UserContribution:
    """A distributed user-level round as parsed: the round, its lattice, the settings the
    vector is computed under, the noise share's std and the bit's scale k (``None``: no bit)."""

    user: UserRound
    lattice: Lattice
    settings: dict[str, Any]
    share: float
    bit_scale: float | None

    @property
    def account(self) -> Account:
        return self.user.account


def parse_delta(msg: Message, context: Context, stage: StageInfo) -> tuple[UserContribution, Charge]:
    """The delta's encoding (and the bit's, with adaptive clipping), checked against the
    secure sum, and its charge, ``distributed_participant_event``."""
    user = read_user_round(msg, context)
    count_noise = userlevel.read_count_noise(user.node.config)  # None: fixed clipping
    dimension = sum(t.numel() for t in user.before.values())
    lattice = read_encoding(user.node.config, user.clip, dimension + (count_noise is not None))
    bound = encoding_settings(stage, lattice, "user", plan=protocol.plan_config(user.plan),
                              noise_multiplier=user.noise_multiplier, count_noise=count_noise)
    multiplier = user.noise_multiplier if count_noise is None else \
        delta_noise_multiplier(user.noise_multiplier, count_noise)
    shares = user.node.policy.honest_shares
    share = lattice.noise_stddev(multiplier, shares)
    bit_scale = None if count_noise is None else count_scale(multiplier * lattice.clip, count_noise)
    event = distributed_participant_event(share, shares, math.hypot(lattice.sensitivity, bit_scale or 0),
                                          lattice.dimension)
    return UserContribution(user, lattice, bound, share, bit_scale), Charge(user.entry, (event,))


def compute_delta(request: UserContribution, booked: Booked) -> Vector:
    """Train, encode the clipped delta (and (2b − 1)·k) on the lattice, add the share."""
    user = request.user
    deltas, under = trained_delta(user, booked.ordinal)
    flat = torch.from_numpy(np.concatenate([d.ravel() for d in deltas.values()]))
    _, rounding, noise = _generators(user, booked)
    total = rounded_sum(flat.unsqueeze(0), request.lattice, rounding).numpy()
    if request.bit_scale is not None:
        total = np.append(total, (2 * under - 1) * request.bit_scale)
    return Vector(noised_vector(total, request.lattice, request.share, noise), request.settings)


def parse_count(msg: Message, context: Context, stage: StageInfo) -> tuple[UserContribution, Charge]:
    """A count-only round: the bit's one-coordinate lattice and ``distributed_count_participant_event``."""
    user = read_user_round(msg, context)
    count_noise = userlevel.read_count_only(user.node.config)
    if count_noise is None:
        raise protocol.ProtocolError("a count-only round names clip-count-noise")
    lattice = read_encoding(user.node.config, float(COUNT_ONLY_SCALE), 1)
    bound = encoding_settings(stage, lattice, "user-count", plan=protocol.plan_config(user.plan),
                              count_noise=count_noise)
    shares = user.node.policy.honest_shares
    charge = Charge(user.entry, (distributed_count_participant_event(count_noise, shares),))
    return UserContribution(user, lattice, bound, count_share_stddev(count_noise, shares), COUNT_ONLY_SCALE), charge


def compute_count(request: UserContribution, booked: Booked) -> Vector:
    """Train, and send (2b − 1)·k plus the share: the delta never leaves the node."""
    _, under = trained_delta(request.user, booked.ordinal)
    _, _, noise = _generators(request.user, booked)
    total = np.array([(2 * under - 1) * COUNT_ONLY_SCALE], dtype=np.int64)
    return Vector(noised_vector(total, request.lattice, request.share, noise), request.settings)


def _generators(user: UserRound, booked: Booked) -> tuple[Any, Any, Any]:
    node = user.node
    return round_generators(node.policy, node.context, booked.ordinal, int(user.account.client), node.server_round)


DELTA: ContributionKind = ReleaseKind(parse_delta, compute_delta)
COUNT: ContributionKind = ReleaseKind(parse_count, compute_count)


def contribute(msg: Message, context: Context, stage: StageInfo) -> tuple[Vector, RecordDict]:
    """Book the round in the node's ledger, then train and compute its vector (count-only:
    the bit's)."""
    count_only = userlevel.read_count_only(msg.content.config_records[protocol.CONFIG]) is not None
    return contribution(COUNT if count_only else DELTA, msg, context, stage)
