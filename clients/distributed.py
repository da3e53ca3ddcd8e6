"""A node's part in a distributed-DP round (``privacy = "distributed"``).

The node takes part only where its policy allows it (``allow-distributed``). Secure
aggregation (``clients.secure_sum``) runs the protocol and checks what the server claims
about the cohort against the node's own ``min-cohort``, ``max-dropouts``,
``max-colluders`` and ``min-secagg-neighbours``. When its masked vector is due, ``contribute`` books and computes it:

- the noise share is sized for the node's own worst case, ``policy.honest_shares`` honest
  survivors (never the server's K): each share has std σ·C·scale/√n, so that n of them
  alone carry the round's σ;
- the charge, ``distributed_dpsgd_event(share, n, Δ₂, d, q, 1)``, is booked in the node's
  durable ledger before anything is computed; the same budget and δ checks as local
  training apply;
- the vector: the node's Poisson lot, each example's gradient clipped to C, rounded onto
  the lattice, summed, plus the noise share, mod 2^bits (``fedpriv.distributed``).

Every value in the message (plan, q, lattice scale, modulus) is untrusted: what the node
does with it is what it books, and values outside their sane ranges are refused. Before it
books, the node also checks that the secure sum can carry its vector (``encoding_settings``:
the sum's dimension and modulus are the lattice's, the lattice's Δ₂ one the rounding can
enforce), and every value its vector depends on goes into the settings it binds into the sum
(``fedpriv.secagg.Vector``): nodes told different settings produce no decodable sum.

Whom the node counts toward its cohort is its policy's ``secagg_trust``: peers certified by
its consortium CA, the server's cohort where it declares that trust, or its own share alone;
without any of these it refuses the round (``docs/threat-model.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict

from clients.release import Booked, ReleaseKind
from clients.secure_sum import Contribute, ContributionKind, answer_stage, contribution
from clients.task import OfRound, loss_function, node_data, read_node_round, received_model, training_seed
from fedpriv.distributed.contribution import distributed_contribution
from fedpriv.distributed.lattice import Lattice, Rounding
from fedpriv.distributed.rounding import MAX_BOUND
from fedpriv.dpsgd.per_example import LossFn
from fedpriv.federation import protocol
from fedpriv.federation.policy import NodePolicy, Randomness, SecAggTrust
from fedpriv.node import checked_policy
from fedpriv.privacy import distributed_dpsgd_event
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import check_sample_rate
from fedpriv.secagg.identity import load_identity
from fedpriv.secagg.node import Requirements, StageInfo, Vector
from fedpriv.seeding import derive_seed, generator
from fedpriv.training import TrainingPlan

MAX_SCALE = 2.0**24
"""Largest lattice scale a node accepts: beyond it a clipped sum no longer fits 32 bits."""


def requirements(policy: NodePolicy) -> Requirements:
    """What the node's policy demands of a secure aggregation's cohort (with a consortium CA,
    every peer certified by it)."""
    identity = None if policy.secagg_ca is None or policy.secagg_identity is None else \
        load_identity(policy.secagg_ca, policy.secagg_identity)
    return Requirements(min_cohort=policy.min_cohort, min_survivors=policy.min_survivors,
                        max_colluders=policy.max_colluders, min_neighbours=policy.min_secagg_neighbours,
                        identity=identity)


def train(msg: Message, context: Context, vector: Contribute | None = None) -> RecordDict:
    """One stage of a distributed round; refused unless the node's policy allows it and says
    whom it counts. ``vector`` computes the node's vector at the collect stage (default:
    ``contribute``, one distributed DP-SGD step; ``clients.userlevel_distributed``: a user-level delta)."""
    policy = checked_policy(context.node_config)
    if not policy.allow_distributed:
        raise protocol.ProtocolError("this node's policy does not allow distributed rounds (allow-distributed = false)")
    if policy.secagg_trust is SecAggTrust.REFUSE:
        raise protocol.ProtocolError(
            "this node has no consortium CA to verify its peers (secagg-ca) and its policy refuses distributed rounds "
            "without one (uncertified-cohort = refuse; own-share, or trust-server-cohort = true, would take part)")
    return answer_stage(msg, context, requirements(policy), vector or contribute)


def encoding_settings(stage: StageInfo, lattice: Lattice, mode: str, **values: Any) -> dict[str, Any]:
    """The settings a vector on ``lattice`` is computed under (``mode``, the lattice's, and
    ``values``: what else it depends on), once the checks that must precede booking passed:
    the secure sum's dimension and modulus are the lattice's (another modulus would hand the
    server every node's own sign, or wrap), and the lattice's Δ₂ is a bound the rounding
    enforces. ``ProtocolError`` otherwise: the one refusal path of every distributed vector."""
    if lattice.dimension != stage.dimension:
        raise protocol.ProtocolError(f"the secure sum has dimension {stage.dimension}, this round's vector "
                                     f"{lattice.dimension}")
    if lattice.modulus_bits != stage.modulus_bits:
        raise protocol.ProtocolError(f"the lattice's modulus is 2^{lattice.modulus_bits}, the secure sum's "
                                     f"2^{stage.modulus_bits}: they must be one")
    if not lattice.sensitivity <= MAX_BOUND:
        raise protocol.ProtocolError(f"the lattice's sensitivity Δ₂ = {lattice.sensitivity:.4g} exceeds the largest "
                                     f"norm the rounding bounds exactly (2^{math.log2(MAX_BOUND):g}): use a coarser "
                                     "scale or a smaller clip norm")
    return {"mode": mode, "lattice-scale": lattice.scale, "lattice-rounding": str(lattice.rounding),
            "lattice-modulus-bits": lattice.modulus_bits, "clip": lattice.max_grad_norm,
            "dimension": lattice.dimension, **values}


def read_lattice(config: Any, max_grad_norm: float, dimension: int) -> tuple[float, Lattice]:
    """(q, lattice) from a round's config, checked: q one the samplers draw faithfully and
    the lattice's encoding (``read_encoding``)."""
    try:
        q = config[protocol.SAMPLE_RATE]
    except KeyError as err:
        raise protocol.ProtocolError(f"distributed config lacks {err}") from None
    q = check_sample_rate(q, "sample-rate", protocol.ProtocolError)
    return float(q), read_encoding(config, max_grad_norm, dimension)


def read_encoding(config: Any, max_grad_norm: float, dimension: int) -> Lattice:
    """The lattice of a round's config for clip norm ``max_grad_norm``, checked: a finite
    power-of-two scale in [1, MAX_SCALE], a modulus of 32 to 62 bits, a known rounding."""
    try:
        scale, bits = config[protocol.LATTICE_SCALE], config[protocol.MODULUS_BITS]
        rounding = Rounding(config[protocol.LATTICE_ROUNDING])
    except KeyError as err:
        raise protocol.ProtocolError(f"distributed config lacks {err}") from None
    except ValueError as err:
        raise protocol.ProtocolError(f"bad lattice-rounding: {err}") from None
    if (not protocol.is_finite_number(scale) or not 1 <= scale <= MAX_SCALE
            or math.log2(scale) != int(math.log2(scale))):
        raise protocol.ProtocolError(f"lattice-scale must be a power of 2 in [1, 2^24], got {scale!r}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 32 <= bits <= 62:
        raise protocol.ProtocolError(f"modulus-bits must be an integer in [32, 62], got {bits!r}")
    return Lattice(float(scale), max_grad_norm, dimension, modulus_bits=bits, rounding=rounding)


def record_encoding(config: Any, plan: TrainingPlan, dimension: int,
                    stage: StageInfo) -> tuple[float, Lattice, dict[str, Any]]:
    """(q, lattice, the settings the vector is computed under) of a record-level round for a
    model of ``dimension`` parameters, checked against the secure sum before booking."""
    q, lattice = read_lattice(config, plan.max_grad_norm, dimension)
    return q, lattice, encoding_settings(stage, lattice, "record", plan=protocol.plan_config(plan), sample_rate=q)


@dataclass(frozen=True)
class Contribution(OfRound):
    """A distributed DP-SGD step as parsed: the plan, the received model, q and the lattice,
    and the settings the vector is computed under."""

    plan: TrainingPlan
    model: torch.nn.Module
    loss_fn: LossFn
    sample_rate: float
    lattice: Lattice
    settings: dict[str, Any]


def parse_contribution(msg: Message, context: Context, stage: StageInfo) -> tuple[Contribution, Charge]:
    """The round's plan and encoding, checked against the secure sum, and its charge:
    ``distributed_dpsgd_event`` of a share sized for the policy's honest survivors."""
    node = read_node_round(msg, context)
    plan = protocol.read_plan(node.config)
    model = received_model(msg, plan.model, node.settings)
    q, lattice, bound = record_encoding(node.config, plan, sum(p.numel() for p in model.parameters()), stage)
    shares = node.policy.honest_shares
    share_stddev = lattice.noise_stddev(plan.noise_multiplier, shares)
    charge = Charge(protocol.train_entry(node.run_key, node.server_round),
                    (distributed_dpsgd_event(share_stddev, shares, lattice.sensitivity, lattice.dimension, q, 1),))
    return Contribution(node, plan, model, loss_function(node.settings), q, lattice, bound), charge


def compute_contribution(request: Contribution, booked: Booked) -> Vector:
    """The node's vector: its lot's clipped gradients on the lattice, summed, plus its share."""
    node, policy = request.node, request.node.policy
    data = node_data(node.settings, node.context, policy, model=request.plan.model)
    sampling, rounding, noise = round_generators(policy, node.context, booked.ordinal, int(request.account.client),
                                                 node.server_round)
    contribution = distributed_contribution(
        request.model, data.features, data.labels, sample_rate=request.sample_rate, lattice=request.lattice,
        noise_multiplier=request.plan.noise_multiplier, honest_shares=policy.honest_shares,
        secure=policy.randomness is Randomness.SECURE, sampling_generator=sampling, rounding_generator=rounding,
        noise_generator=noise, loss_fn=request.loss_fn,
    )
    return Vector(contribution.vector, request.settings)


CONTRIBUTION: ContributionKind = ReleaseKind(parse_contribution, compute_contribution)


def contribute(msg: Message, context: Context, stage: StageInfo) -> tuple[Vector, RecordDict]:
    """Book the round in the node's ledger, then compute its vector (a failure after booking
    leaves as a fixed text)."""
    return contribution(CONTRIBUTION, msg, context, stage)


def round_generators(policy: NodePolicy, context: Context, ordinal: int, client: int, server_round: int,
                     ) -> tuple[torch.Generator | None, torch.Generator | None, np.random.Generator | None]:
    """The (sampling, rounding, noise) generators of a round the node booked as ``ordinal``:
    three separate streams of its training seed, or None each (the OS CSPRNG) with secure
    randomness."""
    if policy.randomness is Randomness.SECURE:
        return None, None, None
    seed = training_seed(policy, context.run_id, ordinal)
    return (generator(seed, "sampling", client, server_round), generator(seed, "rounding", client, server_round),
            np.random.default_rng(derive_seed(seed, "noise", client, server_round)))
