"""A client's work: its partition, its own privacy ledger, local DP-SGD via fedpriv.training.

The client trusts no server: before training it checks, in its *own* ledger kept in
``context.state``, that the round the server asks for (the plan it received, on its own
N) fits its own budget, and that it has not trained this round before; otherwise it
refuses with an error reply and does not touch its data.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict

from clients import protocol
from clients.config import LocalRandomness, RunSettings
from clients.partition import partition_indices
from fedpriv.data import TensorPair, load_dataset
from fedpriv.models import build_model, model_inputs
from fedpriv.privacy import Budget, PrivacyLedger
from fedpriv.training import default_device, evaluate, train_round

LEDGER_STATE = "fedpriv-ledger"


@functools.lru_cache(maxsize=4)
def _dataset(name: str, data_dir: str | None, train: bool, download: bool, limit: int | None) -> TensorPair:
    return load_dataset(name, data_dir, train=train, download=download, limit=limit)


@functools.lru_cache(maxsize=32)
def _partition(settings: RunSettings, partition_id: int, num_partitions: int, train: bool,
               model: str | None) -> TensorPair:
    limit = settings.limit_train if train else settings.limit_test
    full = _dataset(settings.dataset, settings.data_dir, train, settings.download, limit)
    idx = partition_indices(full.labels, settings.partition, num_partitions, partition_id,
                            settings.alpha, settings.seed)
    index = torch.from_numpy(idx)
    features = full.features[index]
    return TensorPair(features if model is None else model_inputs(model, features), full.labels[index])


def local_data(settings: RunSettings, node_config: Mapping[str, Any], train: bool = True,
               model: str | None = None) -> TensorPair:
    """This node's partition of the training (or test) set, from ``partition-id``/``num-partitions``;
    with ``model``, its features are that model's inputs (cached: computed once per node)."""
    return _partition(settings, int(node_config["partition-id"]), int(node_config["num-partitions"]),
                      train, model)


def client_id(node_config: Mapping[str, Any]) -> str:
    """The stable id a client uses in every ledger: its partition id."""
    return str(node_config["partition-id"])


def describe(context: Context) -> RecordDict:
    """The QUERY reply: client id and N."""
    settings = RunSettings.from_run_config(context.run_config)
    n = len(local_data(settings, context.node_config).labels)
    return RecordDict({protocol.INFO: ConfigRecord(
        {protocol.CLIENT_ID: client_id(context.node_config), protocol.NUM_EXAMPLES: n}
    )})


def own_ledger(context: Context, settings: RunSettings) -> PrivacyLedger:
    """The ledger in this node's state, or a fresh one with the client's own budget."""
    if LEDGER_STATE in context.state.config_records:
        return PrivacyLedger.from_dict(json.loads(str(context.state.config_records[LEDGER_STATE]["json"])))
    budget = float(context.node_config.get("epsilon-budget", settings.client_budget))
    return PrivacyLedger(Budget(epsilon=budget, delta=settings.delta), accountant="rdp")


def local_seed(settings: RunSettings, node_config: Mapping[str, Any]) -> tuple[int, bool]:
    """(seed for this round's lots and noise, whether noise must come from the CSPRNG).

    A node's own ``local-seed`` wins (reproducible for its operator, unknown to the
    server); else ``run-seed`` uses the run's seed (simulations); else a fresh secret
    seed and CSPRNG noise (see ``LocalRandomness``).
    """
    if "local-seed" in node_config:
        return int(node_config["local-seed"]), False
    if settings.local_randomness is LocalRandomness.RUN_SEED:
        return settings.seed, False
    return secrets.randbits(63), True


def train(msg: Message, context: Context) -> Message:
    """Local DP-SGD on the received model, or a refusal when the round does not fit."""
    settings = RunSettings.from_run_config(context.run_config)
    cid = client_id(context.node_config)
    config = msg.content.config_records[protocol.CONFIG]
    plan = protocol.read_plan(config)
    round_ = int(config[protocol.SERVER_ROUND])
    ledger = own_ledger(context, settings)
    events = plan.round_events(len(local_data(settings, context.node_config).labels))
    if round_ in ledger.rounds(cid) or not ledger.can_afford(cid, events):
        reason = (f"client {cid} refuses round {round_}: already trained it or it would exceed "
                  f"its own budget (spent ε = {ledger.spent(cid):.4f} of {ledger.budget.epsilon})")
        return Message(Error(code=protocol.REFUSAL_CODE, reason=reason), reply_to=msg)
    model = build_model(plan.model, settings.seed)
    model.load_state_dict(msg.content.array_records[protocol.ARRAYS].to_torch_state_dict())
    seed, secure_noise = local_seed(settings, context.node_config)
    data = local_data(settings, context.node_config, model=plan.model)  # the model's inputs
    report = train_round(model, data.features, data.labels, plan, seed=seed, client=int(cid),
                         round_=round_, device=default_device(), secure_noise=secure_noise)
    ledger.record(cid, round_, report.events)
    context.state.config_records[LEDGER_STATE] = ConfigRecord({"json": json.dumps(ledger.to_dict())})
    content = RecordDict({
        protocol.ARRAYS: ArrayRecord(model.cpu().state_dict()),
        protocol.METRICS: MetricRecord(
            {protocol.NUM_EXAMPLES: report.num_examples, protocol.TRAIN_LOSS: report.mean_loss}
        ),
        protocol.PRIVACY: protocol.events_record(cid, report.events),
    })
    return Message(content, reply_to=msg)


def evaluate_local(msg: Message, context: Context) -> Message:
    """Loss/accuracy of the received model on this node's share of the *test* set.

    These metrics are not privatised; the server asks for them only when
    ``fraction-evaluate`` > 0 (default 0: it evaluates centrally instead).
    """
    settings = RunSettings.from_run_config(context.run_config)
    model_name = str(msg.content.config_records[protocol.CONFIG][protocol.MODEL])
    data = local_data(settings, context.node_config, train=False, model=model_name)
    model = build_model(model_name, settings.seed)
    model.load_state_dict(msg.content.array_records[protocol.ARRAYS].to_torch_state_dict())
    loss, accuracy = evaluate(model, data.features, data.labels)
    metrics = MetricRecord({protocol.NUM_EXAMPLES: len(data.labels), "loss": loss, "accuracy": accuracy})
    return Message(RecordDict({protocol.METRICS: metrics}), reply_to=msg)
