"""A node's work: its partition, its own policy and durable ledger, local DP-SGD.

The node trusts no server. Its policy (``fedpriv.federation.policy``) comes from its
operator; the run config and every message are untrusted input. Before anything leaves
the node, the release is charged to the client in the node's durable ledger (a file in
its state folder, locked against concurrent runs) under the entry the message names, and
a refused charge means nothing is computed. What leaves: the DP count of N (or N where the
policy declares it public), the trained model, and, where the policy allows, a noisy
evaluation. No loss, no exact N. A failure after booking leaves as a fixed text only
(``clients.failures``); δ is checked against the N the node has released (``clients.delta``).

The data it trains and evaluates on is read from its policy's ``data-dir`` (default the
cache folder), never from a folder the run config names, and is never downloaded: which
data a node holds is its own. A node whose folder lacks the data set refuses, before it
books anything, without telling the server its path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from clients.delta import check_delta
from clients.release import Account, Booked, ReleaseKind, account, reply
from clients.releases import Refusal, missing_data, released_size, stored_size
from fedpriv.data import IMAGE_SHAPES, DatasetNotFoundError, TensorPair, default_data_dir, load_dataset
from fedpriv.dpsgd.per_example import LossFn
from fedpriv.federation import protocol
from fedpriv.federation.partition import Split
from fedpriv.federation.policy import NodePolicy, Randomness
from fedpriv.federation.settings import RunSettings
from fedpriv.models import input_shape, model_inputs
from fedpriv.node import checked_policy
from fedpriv.privacy.charge import Charge
from fedpriv.seeding import seeded_training_seed
from fedpriv.task import Task, TaskError, check_model_fits, load_task, run_model
from fedpriv.training import TrainingPlan, default_device, round_spend, train_round


@functools.lru_cache(maxsize=4)
def _dataset(name: str, data_dir: Path | None, train: bool, limit: int | None) -> TensorPair:
    """The node's own copy of data set ``name``, from its policy's ``data_dir`` (``None``: the
    default cache folder); never downloaded. ``Refusal`` (not naming the folder) where it is missing."""
    try:
        return load_dataset(name, data_dir, train=train, download=False, limit=limit)
    except DatasetNotFoundError as err:
        raise missing_data(name) from err


@functools.lru_cache(maxsize=4)
def _split(settings: RunSettings, data_dir: Path | None, num_partitions: int, train: bool, key: int) -> Split:
    """The split of the training (or test) set under the node's ``partition-key``; one per
    process, however many partitions (simulated nodes) the process serves."""
    limit = settings.limit_train if train else settings.limit_test
    full = _dataset(settings.dataset, data_dir, train, limit)
    return Split(full.features, full.labels, settings.partition, num_partitions, settings.alpha, key)


@functools.lru_cache(maxsize=32)
def _partition(settings: RunSettings, data_dir: Path | None, partition_id: int, num_partitions: int, train: bool,
               model: str | None, key: int) -> TensorPair:
    limit = settings.limit_train if train else settings.limit_test
    full = _dataset(settings.dataset, data_dir, train, limit)
    index = torch.tensor(_split(settings, data_dir, num_partitions, train, key).indices(partition_id))
    features = full.features[index]
    return TensorPair(features if model is None else model_inputs(model, features), full.labels[index])


def local_data(settings: RunSettings, node_config: Mapping[str, Any], data_dir: str | Path | None,
               train: bool = True, model: str | None = None, *, partition_key: int) -> TensorPair:
    """This node's partition of the training (or test) set, from ``partition-id``/``num-partitions``
    and its policy's ``partition_key`` (``fedpriv.federation.partition``: the run config's seed chooses no
    record), read from ``data_dir`` (its policy's: ``None`` is the default cache folder; the run
    config's ``data-dir`` is never read); with ``model``, its features are that model's inputs
    (cached: computed once per node). ``Refusal`` where the folder lacks the data set."""
    partition_id, num_partitions = int(node_config["partition-id"]), int(node_config["num-partitions"])
    if settings.task is not None:  # a user's task: its load_data on the node's own folder
        return _task_data(settings.task, None if data_dir is None else Path(data_dir), partition_id, num_partitions,
                          partition_key)[0 if train else 1]
    # the run config's data-dir, download and seed are the server's: out of every cache key
    settings = dataclasses.replace(settings, data_dir=None, download=False, seed=0)
    return _partition(settings, None if data_dir is None else Path(data_dir), partition_id, num_partitions, train,
                      model, partition_key)


def node_task(name: str) -> Task:
    """The run's task module (imported by name from the app's folder), or ``Refusal``: the
    reason without what the user's code said (it could hold the node's paths)."""
    try:
        return load_task(name)
    except TaskError as err:
        raise Refusal(f"this node cannot run the task: {err.public}") from err


@functools.lru_cache(maxsize=8)
def _task_data(name: str, data_dir: Path | None, partition_id: int, num_partitions: int,
               key: int) -> tuple[TensorPair, TensorPair]:
    """(train, test) of the task's ``load_data`` on this node's folder (its policy's; ``None``:
    the default cache folder), its items and model checked (``fedpriv.task``) before
    anything is booked: ``Refusal`` (the contract's reason) otherwise."""
    task = node_task(name)
    try:
        train, test = task.load(partition_id, num_partitions, data_dir or default_data_dir(), key)
        check_model_fits(task, task.build_model(0), train)
    except TaskError as err:
        raise Refusal(f"this node cannot run the task: {err.public}") from err
    return train, test


def loss_function(settings: RunSettings) -> LossFn:
    """What the run trains by: the task's ``loss`` (cross-entropy by default)."""
    return torch.nn.functional.cross_entropy if settings.task is None else node_task(settings.task).loss


def client_id(node_config: Mapping[str, Any]) -> str:
    """The stable id a client uses in every ledger: its partition id."""
    return str(node_config["partition-id"])


def describe(context: Context) -> RecordDict:
    """The QUERY reply: client id, released N (booked first), what an evaluation costs."""
    policy, settings = checked_policy(context.node_config), RunSettings.from_run_config(context.run_config)
    cid = client_id(context.node_config)
    n = len(node_data(settings, context, policy).labels)  # Refusal (the data is missing): nothing booked
    size = released_size(policy, settings, context.node_config, cid, n)
    check_delta(policy.effective_budget(settings).delta, size.value)  # the released N: post-processing
    evaluate_events = (policy.evaluate_event(),) if policy.allow_evaluate else ()
    return RecordDict({
        protocol.INFO: ConfigRecord({protocol.CLIENT_ID: cid, protocol.NUM_EXAMPLES: size.value,
                                     protocol.NUM_EXAMPLES_PUBLIC: size.public}),
        protocol.PRIVACY: protocol.releases_record(size.entries, evaluate_events),
    })


def received_model(msg: Message, name: str, settings: RunSettings) -> torch.nn.Module:
    """The model the server sent, loaded strictly into ``name``'s architecture (the run's
    task's model, where it names one), refused (before anything is booked) unless that
    architecture takes the run's data set: one input of its shape gives a row of class scores
    (a task's model is checked against its own data, ``_task_data``)."""
    try:
        model = run_model(name, settings.seed, settings.task)
    except TaskError as err:
        raise Refusal(f"this node cannot run the task: {err.public}") from err
    try:
        model.load_state_dict(msg.content.array_records[protocol.ARRAYS].to_torch_state_dict())
    except (KeyError, RuntimeError, ValueError, TypeError) as err:
        raise protocol.ProtocolError(f"received arrays do not fit model {name!r}: {err}") from err
    image = IMAGE_SHAPES.get(settings.dataset) if settings.task is None else None
    if image is not None:
        training = model.training
        try:
            with torch.no_grad():
                scores = model.eval()(torch.zeros(1, *input_shape(name, image)))
        except (RuntimeError, ValueError) as err:
            raise protocol.ProtocolError(f"model {name!r} does not take {settings.dataset} inputs") from err
        finally:
            model.train(training)
        if scores.dim() != 2 or len(scores) != 1:
            raise protocol.ProtocolError(f"model {name!r} gives no class scores for {settings.dataset} inputs")
    return model


@dataclass(frozen=True)
class NodeRound:
    """What every release of a round reads and checks before it books: the node's account
    (δ checked against the N it released), the run's settings, the round's config and keys."""

    account: Account
    settings: RunSettings
    context: Context
    config: ConfigRecord
    run_key: str
    server_round: int
    num_examples: int
    """The N the node released for its training partition (public, or its DP count)."""

    @property
    def policy(self) -> NodePolicy:
        return self.account.policy


def read_node_round(msg: Message, context: Context) -> NodeRound:
    """The round of ``msg`` under the node's policy: ``Refusal`` or ``ProtocolError`` before
    anything is booked (no released N for this partition, δ too large for it, a malformed key)."""
    policy, settings = checked_policy(context.node_config), RunSettings.from_run_config(context.run_config)
    config = msg.content.config_records[protocol.CONFIG]
    run_key, server_round = protocol.read_round(config)
    num_examples = stored_size(policy, settings, context.node_config, len(node_data(settings, context, policy).labels))
    where = account(policy, client_id(context.node_config), policy.effective_budget(settings), num_examples)
    return NodeRound(where, settings, context, config, run_key, server_round, num_examples)


@dataclass(frozen=True)
class OfRound:
    """A request of one round (its ``node``), booked to the round's account."""

    node: NodeRound

    @property
    def account(self) -> Account:
        return self.node.account


@dataclass(frozen=True)
class Training(OfRound):
    """A local DP-SGD round as parsed: the plan, the received model, the task's loss."""

    plan: TrainingPlan
    model: torch.nn.Module
    loss_fn: LossFn


def parse_training(msg: Message, context: Context) -> tuple[Training, Charge]:
    """The plan's round at the released N, charged as the DP-SGD engine spends it, and the
    received model checked against the run's architecture."""
    node = read_node_round(msg, context)
    plan = protocol.read_plan(node.config)
    charge = Charge(protocol.train_entry(node.run_key, node.server_round), plan.round_events(node.num_examples))
    charge.require_same(round_spend(plan, node.num_examples), "the DP-SGD engine")  # explicit: python -O keeps it
    return Training(node, plan, received_model(msg, plan.model, node.settings), loss_function(node.settings)), charge


def compute_training(request: Training, booked: Booked) -> RecordDict:
    """Run local DP-SGD on the received model; the trained model."""
    node, policy, model = request.node, request.node.policy, request.model
    data = node_data(node.settings, node.context, policy, model=request.plan.model)  # the model's inputs
    report = train_round(
        model, data.features, data.labels, request.plan,
        seed=training_seed(policy, node.context.run_id, booked.ordinal), client=int(request.account.client),
        round_=node.server_round, device=default_device(), secure=policy.randomness is Randomness.SECURE,
        num_examples=node.num_examples, fit_physical_batch=True, loss_fn=request.loss_fn,
    )
    booked.charge.require_same(report.events, "this training")  # a bug, not input: nothing is sent
    return RecordDict({protocol.ARRAYS: ArrayRecord(model.cpu().state_dict())})


TRAINING = ReleaseKind(parse_training, compute_training)


def train(msg: Message, context: Context) -> RecordDict:
    """Book the round, then run local DP-SGD on the received model and return it."""
    return reply(TRAINING, msg, context)


def node_data(settings: RunSettings, context: Context, policy: NodePolicy, train: bool = True,
               model: str | None = None) -> TensorPair:
    """This node's share of the training (or test) set: ``local_data`` from its policy's
    ``data-dir``, split by its ``partition-key``."""
    return local_data(settings, context.node_config, policy.data_dir, train=train, model=model,
                      partition_key=policy.partition_key)


def training_seed(policy: NodePolicy, run_id: int, ordinal: int) -> int:
    """Seed of one training's lots and noise; unused (0) where they come from the CSPRNG."""
    if policy.randomness is Randomness.SECURE:
        return 0
    return seeded_training_seed(policy.seed or 0, run_id, ordinal)
