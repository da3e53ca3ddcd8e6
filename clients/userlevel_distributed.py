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
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from clients.distributed import encoding_settings, read_encoding, round_generators
from clients.failures import after_booking
from clients.releases import book
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


def contribute(msg: Message, context: Context, stage: StageInfo) -> tuple[Vector, RecordDict]:
    """Book the round in the node's ledger, then train and compute its vector."""
    request = read_user_round(msg, context)
    config = msg.content.config_records[protocol.CONFIG]
    count_only = userlevel.read_count_only(config)
    if count_only is not None:
        return contribute_count(request, config, context, stage, count_only)
    count_noise = userlevel.read_count_noise(config)  # None: fixed clipping
    lattice, bound = user_encoding(request, config, stage, count_noise)
    multiplier = request.noise_multiplier if count_noise is None else \
        delta_noise_multiplier(request.noise_multiplier, count_noise)
    shares = request.policy.honest_shares
    share = lattice.noise_stddev(multiplier, shares)
    bit_scale = 0 if count_noise is None else count_scale(multiplier * lattice.clip, count_noise)
    event = distributed_participant_event(share, shares, math.hypot(lattice.sensitivity, bit_scale), lattice.dimension)
    charge = Charge(request.entry, (event,))
    ordinal = book(request.policy, request.client, charge, request.budget)
    with after_booking(charge.entry):
        deltas, under = trained_delta(request, context, ordinal)
        flat = torch.from_numpy(np.concatenate([d.ravel() for d in deltas.values()]))
        _, rounding, noise = round_generators(request.policy, context, ordinal, int(request.client),
                                              request.server_round)
        total = rounded_sum(flat.unsqueeze(0), lattice, rounding).numpy()
        if count_noise is not None:
            total = np.append(total, (2 * under - 1) * bit_scale)
        vector = noised_vector(total, lattice, share, noise)
    return Vector(vector, bound), RecordDict({protocol.PRIVACY: protocol.charge_record(charge)})


def user_encoding(request: UserRound, config: ConfigRecord, stage: StageInfo,
                  count_noise: float | None) -> tuple[Lattice, dict[str, Any]]:
    """The round's lattice for the delta (and the bit's coordinate with adaptive clipping) and
    the settings the vector is computed under, checked against the secure sum before booking."""
    dimension = sum(t.numel() for t in request.before.values())
    lattice = read_encoding(config, request.clip, dimension + (count_noise is not None))
    return lattice, encoding_settings(stage, lattice, "user", plan=protocol.plan_config(request.plan),
                                      noise_multiplier=request.noise_multiplier, count_noise=count_noise)


def contribute_count(request: UserRound, config: ConfigRecord, context: Context, stage: StageInfo,
                     count_noise: float) -> tuple[Vector, RecordDict]:
    """A count-only round: book the count's event, train, and send (2b − 1)·k plus a share."""
    lattice = read_encoding(config, float(COUNT_ONLY_SCALE), 1)
    bound = encoding_settings(stage, lattice, "user-count", plan=protocol.plan_config(request.plan),
                              count_noise=count_noise)
    shares = request.policy.honest_shares
    charge = Charge(request.entry, (distributed_count_participant_event(count_noise, shares),))
    ordinal = book(request.policy, request.client, charge, request.budget)
    with after_booking(charge.entry):
        _, under = trained_delta(request, context, ordinal)
        _, _, noise = round_generators(request.policy, context, ordinal, int(request.client), request.server_round)
        total = np.array([(2 * under - 1) * COUNT_ONLY_SCALE], dtype=np.int64)
        vector = noised_vector(total, lattice, count_share_stddev(count_noise, shares), noise)
    return Vector(vector, bound), RecordDict({protocol.PRIVACY: protocol.charge_record(charge)})
