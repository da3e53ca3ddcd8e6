"""A node's part in a central user-level round (``privacy = "user"``, ``server.userlevel``).

Only with ``allow-central-user`` in its policy: the node then trusts the server with its
clipped model delta, which leaves without noise, and with adding the noise the server names.
It books ``participant_event(z)`` (the round's cost to its records, for the z the server
says it adds) under the round's entry *before* training, as every release, then trains
with the plain local plan (no per-example clipping or noise), clips its whole delta to S
and sends it with the bit 1[‖Δ‖ ≤ S] for adaptive clipping.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from clients.delta import check_delta
from clients.failures import after_booking
from clients.releases import book, stored_size
from clients.task import client_id, node_data, received_model, training_seed
from fedpriv.federation import protocol, userlevel
from fedpriv.federation.policy import Randomness
from fedpriv.federation.settings import RunSettings
from fedpriv.node import checked_policy
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.userlevel import participant_event
from fedpriv.training import default_device, train_round


def clipped_delta(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor],
                  clip: float) -> tuple[ArrayRecord, int]:
    """(after − before) scaled to L2 norm ≤ ``clip`` (float64, cast back), and 1[‖Δ‖ ≤ clip]."""
    deltas = {name: after[name].detach().cpu().double().numpy() - before[name].double().numpy() for name in before}
    norm = math.sqrt(sum(float(np.sum(d * d)) for d in deltas.values()))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    arrays = {name: Array((d * scale).astype(before[name].numpy().dtype)) for name, d in deltas.items()}
    return ArrayRecord(arrays), int(norm <= clip)


def train(msg: Message, context: Context) -> RecordDict:
    """Book the round, train on the received model, reply with the clipped delta and its bit."""
    policy, settings = checked_policy(context.node_config), RunSettings.from_run_config(context.run_config)
    if not policy.allow_central_user:
        raise protocol.ProtocolError("this node's policy does not send un-noised updates to a server that adds "
                                     "the noise (allow-central-user = false)")
    cid = client_id(context.node_config)
    config = msg.content.config_records[protocol.CONFIG]
    plan = protocol.read_plan(config).non_private()
    clip, noise_multiplier = userlevel.read_user_round(config)
    run_key, server_round = protocol.read_round(config)
    num_examples = stored_size(policy, settings, context.node_config, len(node_data(settings, context, policy).labels))
    budget = policy.effective_budget(settings)
    check_delta(budget.delta, num_examples)
    charge = Charge(protocol.train_entry(run_key, server_round), (participant_event(noise_multiplier),))
    model = received_model(msg, plan.model, settings.seed)  # checked before anything is booked
    before = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    ordinal = book(policy, cid, charge, budget)
    with after_booking(charge.entry):
        data = node_data(settings, context, policy, model=plan.model)
        train_round(
            model, data.features, data.labels, plan, seed=training_seed(policy, context.run_id, ordinal),
            client=int(cid), round_=server_round, device=default_device(),
            secure=policy.randomness is Randomness.SECURE, num_examples=num_examples, fit_physical_batch=True,
        )
        delta, under = clipped_delta(before, model.cpu().state_dict(), clip)
    return RecordDict({
        protocol.ARRAYS: delta,
        protocol.PRIVACY: protocol.charge_record(charge),
        userlevel.USER: MetricRecord({userlevel.UNDER_CLIP: under}),
    })
