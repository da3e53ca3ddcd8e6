"""A node's noisy, booked evaluation of the received model on its test partition (EVALUATE).

Where its policy allows it (``allow-evaluate``), the node releases three integers with
discrete Gaussian noise, booked as one ``policy.evaluate_event()``
(``fedpriv.federation.releases.noisy_evaluation``): the number of test records, how many are
correct and the sum of their losses, each record's loss clipped to [0, L] and counted in
steps of L / ``LOSS_STEPS``. One record moves them by at most (1, 1, ``LOSS_STEPS``) steps
whatever L is, so the event covers any bound; L is the request's ``loss-clip`` where it
names one (finite, in (0, ``MAX_LOSS_CLIP``]), else ``LOSS_CLIP``.

The loss and "correct" are the run's task's (``fedpriv.task``), each computed on a record
alone (``task_scores``): its ``loss`` of a batch of one (default cross-entropy), and the
record counted correct where its ``metrics``' ``"accuracy"`` on it alone is at least 1/2
(without ``metrics``: where its argmax is its integer class; a task whose records have no
class, e.g. a regression, counts none correct: its noisy "correct" says nothing). No other
metric leaves the node: a batch's metric has no bound on what one record moves it by, so
it could not be noised for a booked event. Every one of these is tried on the node's test
records before anything is booked: a task that cannot score them is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from flwr.app import Context, Message, MetricRecord, RecordDict

from clients.release import Booked, ReleaseKind, reply
from clients.releases import Refusal
from clients.task import OfRound, node_data, node_task, read_node_round, received_model
from fedpriv.data import TensorPair
from fedpriv.dpsgd.per_example import per_example_losses
from fedpriv.federation import protocol
from fedpriv.federation.policy import LOSS_CLIP
from fedpriv.federation.releases import RecordScores, classification_scores, noisy_evaluation
from fedpriv.node import checked_policy
from fedpriv.privacy.charge import Charge
from fedpriv.task import Task, argmax_correct

LOSS_CLIP_KEY = "loss-clip"
"""The EVALUATE config's optional bound L on a record's loss (default ``LOSS_CLIP``)."""

MAX_LOSS_CLIP = 2.0**20
"""The largest L a node takes: a loss sum's steps of L / ``LOSS_STEPS`` stay exact doubles."""


@dataclass(frozen=True)
class Evaluation(OfRound):
    """An EVALUATE as parsed: the received model, the node's test records, how each is scored."""

    model: torch.nn.Module
    data: TensorPair
    scores: RecordScores
    loss_clip: float


def task_scores(task: Task) -> RecordScores:
    """Each record's loss and correctness under ``task`` (see the module's docstring)."""
    if task.loss is F.cross_entropy and task.metrics is None:
        return classification_scores

    loss, metrics = task.loss, task.metrics

    def scores(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        losses = per_example_losses(loss, outputs, targets)
        if metrics is not None:
            hits = [float(metrics(outputs[i:i + 1], targets[i:i + 1]).get("accuracy", 0.0)) >= 0.5
                    for i in range(len(targets))]
            return losses, torch.tensor(hits, dtype=torch.bool, device=outputs.device)
        return losses, argmax_correct(outputs, targets)

    return scores


def read_loss_clip(config: Any) -> float:
    """The request's bound on a record's loss, checked (``LOSS_CLIP`` where it names none)."""
    value = config.get(LOSS_CLIP_KEY, LOSS_CLIP)
    if not protocol.is_finite_number(value) or not 0 < value <= MAX_LOSS_CLIP:
        raise protocol.ProtocolError(f"{LOSS_CLIP_KEY} must be a number in (0, 2^20], got {value!r}")
    return float(value)


def parse_evaluation(msg: Message, context: Context) -> tuple[Evaluation, Charge]:
    """An EVALUATE the node's policy allows, of a model of the run's architecture, on test
    records the run's task can score (tried on two of them here, before anything is booked)."""
    if not checked_policy(context.node_config).allow_evaluate:
        raise protocol.ProtocolError("this node's policy does not allow evaluation (allow-evaluate = false)")
    node = read_node_round(msg, context)
    model_name = str(node.config[protocol.MODEL])
    model = received_model(msg, model_name, node.settings)
    loss_clip = read_loss_clip(node.config)
    data = node_data(node.settings, context, node.policy, train=False, model=model_name)
    scores: RecordScores = classification_scores
    if node.settings.task is not None:
        scores = task_scores(node_task(node.settings.task))
        _check_scores(model, data, scores)
    charge = Charge(protocol.evaluate_entry(node.run_key, node.server_round), (node.policy.evaluate_event(),))
    return Evaluation(node, model, data, scores, loss_clip), charge


def _check_scores(model: torch.nn.Module, data: TensorPair, scores: RecordScores) -> None:
    """``Refusal`` unless the task's scores of two test records are a loss and a bool each
    (a non-finite loss is fine: it counts as the bound)."""
    training = model.training
    try:
        with torch.no_grad():
            losses, hits = scores(model.eval()(data.features[:2]), data.labels[:2])
        ok = losses.shape == hits.shape == (min(2, len(data.labels)),) and hits.dtype == torch.bool
    except Exception as err:  # the user's code: its text stays on the node
        raise Refusal("this node cannot evaluate the task: its loss or metrics do not score one record alone "
                      "(loss(outputs, targets) of a batch of one, metrics' \"accuracy\" a number)") from err
    finally:
        model.train(training)
    if not ok:
        raise Refusal("this node cannot evaluate the task: its loss does not give one value per record")


def compute_evaluation(request: Evaluation, booked: Booked) -> RecordDict:
    """The noisy (count, correct, loss sum), seeded (where the node is) by the booking's ordinal."""
    metrics = noisy_evaluation(request.model, request.data.features, request.data.labels, request.node.policy,
                               request.node.context.run_id, booked.ordinal, scores=request.scores,
                               loss_clip=request.loss_clip)
    return RecordDict({protocol.METRICS: MetricRecord(dict(metrics))})


EVALUATION = ReleaseKind(parse_evaluation, compute_evaluation)


def evaluate(msg: Message, context: Context) -> RecordDict:
    """A noisy, booked evaluation of the received model on this node's test partition, where
    the node's policy allows it (and δ fits the N it released for its training partition)."""
    return reply(EVALUATION, msg, context)
