"""The one round loop of every privacy mode: admit → book → collect → close the round →
update (``PrivateFedAvg.run_round``); the mode supplies its parts (``server.mechanism``).

Invariants, whatever the mode:
- A round is booked under the entry ``<run key>/round-<r>/train`` *before* anything is sent
  (saved atomically when durable): a lost reply still counts. Booking is idempotent per
  entry, so a resumed round is not counted twice. Federated evaluation is booked the same
  way (``server.booking.Sample``), and only nodes whose policy answers EVALUATE are asked.
- Replies are untrusted: the mode's collector (``server.collect``) uses only those that
  answer this round's messages and pass its checks; the FedAvg weight of a client is the
  server's own (``server.assign``), never a number a reply reports.
- ``close_round``: each client's ε is logged (summarised past ``MANY_CLIENTS``) and, with
  ``accept_failures`` false (the run config's ``accept-failures``), a round in which any
  member failed (refused, errored, sent no reply in time, or dropped out of the secure
  sum) updates nothing: the previous model is kept and the round's log says why
  (``RoundLog.discarded``). Rejected replies are dropped either way.
- Nodes that connect after the start are described and admitted before the next round
  (``admit``). Ledgers are keyed by client id, so a client that reconnects under a new
  node id keeps its history; a node claiming the id of a client still online is ignored.

The loop is fedpriv's own, not a Flower ``Strategy``'s ``start`` (``server.run``: resume).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedpriv.federation import protocol
from server.assign import Assignment
from server.booking import Sample
from server.checks import check_evaluate_reply
from server.collect import PlainReplies
from server.history import MANY_CLIENTS, History, RoundLog, epsilon_summary, epsilon_text
from server.ledger import ServerLedger
from server.mechanism import Booking, Mechanism, Round

Admit = Callable[[Grid, list[int]], Mapping[int, Assignment]]
"""``admit(grid, node_ids)``: the assignments of those new nodes that described themselves."""


class PrivateFedAvg:
    """Budget-aware federated rounds over the clients the server ledger allows, the privacy
    mode's parts (``mechanism``) deciding who is booked, what, how replies are collected and
    how the model moves."""

    def __init__(self, ledger: ServerLedger, nodes: Mapping[int, Assignment], history: History, run_key: str,
                 mechanism: Mechanism, *, fraction_evaluate: float = 0.0, seed: int = 0, admit: Admit | None = None,
                 accept_failures: bool = True) -> None:
        self.ledger, self.history, self.mechanism = ledger, history, mechanism
        self.run_key = protocol.check_run_key(run_key)
        self.accept_failures = accept_failures
        self.nodes: dict[int, Assignment] = {}
        for node, assignment in nodes.items():
            self._add(node, assignment)
        self.admit = admit
        self._asked: set[int] = set(self.nodes)  # nodes described once are not asked again
        self.fraction_evaluate = fraction_evaluate
        self.evaluation = Sample(fraction_evaluate, seed, lambda a, entry: a.charge(entry, evaluate=True),
                                 evaluate=True)
        self._evaluate_replies = PlainReplies(_check_evaluation, MessageType.EVALUATE, "evaluation")

    def state(self) -> dict[str, Any]:
        """What a resumed run needs beyond the model, history and ledger (the mode's)."""
        return self.mechanism.state()

    def resolved(self) -> dict[str, Any]:
        """What ``results.json``'s ``resolved`` adds for the mode."""
        return self.mechanism.resolved()

    # --- the round ----------------------------------------------------------------------
    def run_round(self, grid: Grid, server_round: int, arrays: ArrayRecord, timeout: float | None) -> ArrayRecord:
        """Admit, book, collect, close, update: the new global model (the old one when the
        round updates nothing). Replies later than ``timeout`` seconds are not waited for."""
        start = time.perf_counter()
        online = frozenset(grid.get_node_ids())
        self._admit_new(grid, online)
        entry = protocol.train_entry(self.run_key, server_round)
        with self.ledger.transaction() as ledger:
            cohort = self.mechanism.book(Booking(ledger, self.nodes, entry, server_round, online))
        rnd = Round(server_round, entry, arrays, {n: self.nodes[n] for n in cohort},
                    self.history.start_round(server_round, [self.nodes[n].client_id for n in cohort]))
        self.mechanism.opened(rnd)

        def content(node: int) -> RecordDict:
            config = ConfigRecord({**self.mechanism.train_config(rnd, self.nodes[node]),
                                   protocol.SERVER_ROUND: server_round, protocol.RUN_KEY: self.run_key})
            return RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: config})

        collected = self.mechanism.collector.collect(grid, rnd, content, timeout)
        if self.close_round(rnd.log, collected.contributions, start):
            return arrays
        updated = self.mechanism.update(rnd, collected)
        return arrays if updated is None else updated

    def close_round(self, round_log: RoundLog, contributions: int, start: float) -> bool:
        """Log each client's ε (summarised past ``MANY_CLIENTS``) and the round's outcome; True
        when its updates are discarded (``accept_failures`` false and a member failed)."""
        ledger = self.ledger.snapshot()
        round_log.epsilon = {a.client_id: ledger.spent(a.client_id) for a in self.nodes.values()}
        delta = self.ledger.budget.delta
        if len(round_log.participants) > MANY_CLIENTS:
            log(INFO, "\tε of the round's clients (δ = %g): %s", delta,
                epsilon_summary(round_log.epsilon[cid] for cid in round_log.participants))
        else:
            for cid in round_log.participants:
                log(INFO, "\tclient %s: ε = %s (δ = %g)", cid, epsilon_text(round_log.epsilon[cid]), delta)
        log(INFO, "aggregate_train: %d accepted, %d rejected, %d refused or failed",
            contributions, len(round_log.rejected), len(round_log.failed))
        round_log.train_seconds = time.perf_counter() - start
        if round_log.failed and not self.accept_failures:
            round_log.discarded = (f"accept-failures = false and {len(round_log.failed)} of "
                                   f"{len(round_log.participants)} clients failed: the previous model is kept")
            log(WARNING, "Round %d: %s", round_log.round, round_log.discarded)
            return True
        return False

    def evaluate_round(self, grid: Grid, server_round: int, arrays: ArrayRecord, model_name: str,
                       timeout: float | None) -> None:
        """Federated evaluation (``fraction_evaluate`` of the nodes that answer EVALUATE):
        loss and accuracy from the noisy sums of the replies that pass the checks, in the
        round's log."""
        if self.fraction_evaluate == 0:
            return
        entry = protocol.evaluate_entry(self.run_key, server_round)
        with self.ledger.transaction() as ledger:
            sampled = self.evaluation.book(Booking(ledger, self.nodes, entry, server_round,
                                                   frozenset(grid.get_node_ids())))
        if not sampled:
            return
        config = ConfigRecord({protocol.MODEL: model_name, protocol.SERVER_ROUND: server_round,
                               protocol.RUN_KEY: self.run_key})
        scratch = RoundLog(server_round, [])
        rnd = Round(server_round, entry, arrays, {n: self.nodes[n] for n in sampled}, scratch)
        collected = self._evaluate_replies.collect(
            grid, rnd, lambda node: RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: config}), timeout)
        sums = {protocol.COUNT: 0.0, protocol.CORRECT: 0.0, protocol.LOSS_SUM: 0.0}
        for _, content in collected.replies:
            reported = content.metric_records[protocol.METRICS]
            for key in sums:
                value = reported[key]
                if isinstance(value, list):  # check_evaluate_reply refused it already
                    raise TypeError(f"metric {key!r} is a list, not a number")
                sums[key] += float(value)
        count = max(sums[protocol.COUNT], 1.0)
        accuracy = min(1.0, max(0.0, sums[protocol.CORRECT] / count))
        round_log = next(r for r in self.history.rounds if r.round == server_round)
        round_log.federated_evaluation = {"loss": sums[protocol.LOSS_SUM] / count, "accuracy": accuracy,
                                          "count": sums[protocol.COUNT], "failed": scratch.failed,
                                          "rejected": scratch.rejected}

    # --- admission ----------------------------------------------------------------------
    def _add(self, node: int, assignment: Assignment) -> None:
        assignment = self.mechanism.assigned(assignment)
        self.nodes[node] = assignment
        self.history.clients[assignment.client_id] = {"num_examples": assignment.num_examples,
                                                      "weight": assignment.weight, **assignment.config}

    def _admit_new(self, grid: Grid, online: frozenset[int]) -> None:
        """Describe and add the nodes that connected since the last round."""
        new = sorted(online - self._asked)
        if not new or self.admit is None:
            return
        self._asked.update(new)
        holder = {a.client_id: node for node, a in self.nodes.items()}
        for node, assignment in self.admit(grid, new).items():
            old = holder.get(assignment.client_id)
            if old in online:
                log(WARNING, "Node %d claims client %s, held by online node %d: ignored",
                    node, assignment.client_id, old)
                continue
            if old is not None:
                del self.nodes[old]
                log(INFO, "Client %s reconnected as node %d (was %d)", assignment.client_id, node, old)
            else:
                log(INFO, "Client %s joined as node %d", assignment.client_id, node)
            self._add(node, assignment)
            holder[assignment.client_id] = node


def _check_evaluation(rnd: Round, assignment: Assignment, reply: Message) -> str | None:
    return check_evaluate_reply(reply, assignment.charge(rnd.entry, evaluate=True))
