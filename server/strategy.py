"""Budget-aware FedAvg: samples only clients that can afford the round, books on send,
and aggregates only replies that pass every check.

Invariants:
- A client is sampled only if the server ledger can afford its assigned events, and the
  round is booked under the entry ``<run key>/round-<r>/train`` *before* the message is
  sent (saved atomically when durable): a lost reply still counts. Booking is idempotent
  per entry, so a resumed round is not counted twice. Federated evaluation is booked the
  same way, and only nodes whose policy answers EVALUATE are asked.
- A reply is used only if it answers a message sent this round, from the node it was sent
  to, for the first time (no duplicates, no stale rounds), and passes
  ``server.checks`` (records, entry and events, names/shapes/dtypes, finite, update norm
  within the plan's bound). A rejected reply is logged with the client id and reason.
- The FedAvg weight of a client is the server's own (its released N, capped in
  ``server.assign``), never a number a reply reports.
- With ``accept_failures`` false (the run config's ``accept-failures``), a round in which
  any sampled client failed (refused, errored, or sent no reply in time) aggregates
  nothing: the previous model is kept and the round's log says why (``RoundLog.discarded``).
  Rejected replies are dropped either way.
- Nodes that connect after the start are described and admitted before the next round
  (``admit``). Ledgers are keyed by client id, so a client that reconnects under a new
  node id keeps its history; a node claiming the id of a client still online is ignored.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log

from fedpriv.federation import protocol
from fedpriv.privacy import LedgerError, PrivacyLedger
from fedpriv.privacy.charge import Charge
from fedpriv.seeding import derive_seed
from server.assign import Assignment
from server.checks import check_evaluate_reply, check_train_reply, update_norm_bound
from server.history import MANY_CLIENTS, History, RoundLog, epsilon_summary, epsilon_text
from server.ledger import ServerLedger

NO_REPLY = "no reply (the node crashed or left, or passed the round timeout); its round stays booked"

Admit = Callable[[Grid, list[int]], Mapping[int, Assignment]]
"""``admit(grid, node_ids)``: the assignments of those new nodes that described themselves."""


class BudgetExhausted(Exception):
    """No known client can afford another round: the run stops here."""


@dataclass(frozen=True)
class Sent:
    """A message this round sent, and to whom."""

    assignment: Assignment
    message: Message


class BudgetedFedAvg(FedAvg):
    """FedAvg over the clients the server ledger allows, weighted by the server's own weights."""

    def __init__(
        self,
        ledger: ServerLedger,
        nodes: Mapping[int, Assignment],
        history: History,
        run_key: str,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 0.0,
        seed: int = 0,
        admit: Admit | None = None,
        accept_failures: bool = True,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
            min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1,
        )
        self.accept_failures = accept_failures
        self.ledger = ledger
        self.history = history
        self.run_key = protocol.check_run_key(run_key)
        self.nodes: dict[int, Assignment] = {}
        for node, assignment in nodes.items():
            self._add(node, assignment)
        self.admit = admit
        self._asked: set[int] = set(self.nodes)  # nodes described once are not asked again
        self.seed = seed
        self._sent: dict[int, Sent] = {}
        self._global = ArrayRecord()
        self._afford: dict[tuple[Any, ...], bool] = {}
        self._round_start = 0.0

    def resolved(self) -> dict[str, Any]:
        """What ``results.json``'s ``resolved`` adds for this strategy (nothing here)."""
        return {}

    def state(self) -> dict[str, Any]:
        """What a resumed run needs of this strategy beyond the model, history and ledger
        (checkpointed after every round): nothing here, the sampling is drawn per round."""
        return {}

    def summary(self) -> None:
        """Log the sampling and budget settings."""
        super().summary()
        log(INFO, "\t└──> Privacy: %d clients, budget %s", len(self.nodes), self.ledger.budget)

    # --- sampling and booking -----------------------------------------------------------
    def affordable(self, ledger: PrivacyLedger, entry: str, evaluate: bool = False) -> list[int]:
        """Node ids whose client can still afford ``entry`` (already booked counts as
        affordable: re-sending it costs nothing more), by client id."""
        ok = [n for n, a in self.nodes.items()
              if (a.evaluate_events or not evaluate) and self._can_afford(ledger, a, entry, evaluate)]
        return sorted(ok, key=lambda n: self.nodes[n].client_id)

    def _can_afford(self, ledger: PrivacyLedger, a: Assignment, entry: str, evaluate: bool) -> bool:
        """``ledger.can_afford``, memoised on (history, events, budget): clients with the
        same history share one accountant call (RDP at large q takes ~0.5 s)."""
        if ledger.has_entry(a.client_id, entry):
            return True
        events = self.round_charge(a, entry, evaluate).events
        key = (ledger.events(a.client_id), events, ledger.budget_for(a.client_id))
        if key not in self._afford:
            self._afford[key] = ledger.can_afford(a.client_id, events)
        return self._afford[key]

    def round_charge(self, assignment: Assignment, entry: str, evaluate: bool = False) -> Charge:
        """What ``entry`` costs ``assignment``'s client: what is booked before it is sent."""
        return assignment.charge(entry, evaluate)

    def _sample_and_book(self, server_round: int, grid: Grid, evaluate: bool) -> list[int]:
        """Sample affordable online nodes and book their entries before anything is sent."""
        entry = (protocol.evaluate_entry if evaluate else protocol.train_entry)(self.run_key, server_round)
        fraction = self.fraction_evaluate if evaluate else self.fraction_train
        online = set(grid.get_node_ids())
        with self.ledger.transaction() as ledger:
            eligible = self.affordable(ledger, entry, evaluate)
            if not eligible and not evaluate:
                raise BudgetExhausted(f"round {server_round}: no client can afford another round")
            eligible = [n for n in eligible if n in online]
            size = min(len(eligible), max(1, int(len(self.nodes) * fraction)))
            rng = random.Random(derive_seed(self.seed, "server-evaluate" if evaluate else "server-sampling",
                                            server_round))
            booked = []
            for node in sorted(rng.sample(eligible, size), key=lambda n: self.nodes[n].client_id):
                assignment = self.nodes[node]
                charge = self.round_charge(assignment, entry, evaluate)
                try:
                    ledger.record(assignment.client_id, charge.entry, charge.events)
                except LedgerError as err:  # a resumed round booked with other events
                    log(WARNING, "Client %s not sent %s: %s", assignment.client_id, entry, err)
                    continue
                booked.append(node)
        log(INFO, "configure_%s: %d of %d affordable clients sampled (%d known)",
            "evaluate" if evaluate else "train", len(booked), len(eligible), len(self.nodes))
        return booked

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One TRAIN per sampled affordable client, with its own plan; booked before sent."""
        self._round_start = time.perf_counter()
        self._admit_new(grid, set(grid.get_node_ids()))
        sampled = self._sample_and_book(server_round, grid, evaluate=False)
        self._global = arrays
        self._sent = {}
        for node in sampled:
            node_config = ConfigRecord({**config, **self.nodes[node].config, **self.train_config(server_round)})
            node_config[protocol.SERVER_ROUND] = server_round
            node_config[protocol.RUN_KEY] = self.run_key
            content = RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: node_config})
            self._sent[node] = Sent(self.nodes[node], Message(content, node, MessageType.TRAIN))
        return [s.message for s in self._sent.values()]

    def train_config(self, server_round: int) -> dict[str, Any]:
        """What every TRAIN of ``server_round`` carries besides its client's plan: nothing here
        (a subclass's hook: ``server.userlevel``)."""
        return {}

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One EVALUATE per sampled node whose policy answers it; booked before sent."""
        if self.fraction_evaluate == 0:
            self._sent = {}
            return []
        sampled = self._sample_and_book(server_round, grid, evaluate=True)
        self._sent = {}
        for node in sampled:
            node_config = ConfigRecord({**config, protocol.SERVER_ROUND: server_round, protocol.RUN_KEY: self.run_key})
            content = RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: node_config})
            self._sent[node] = Sent(self.nodes[node], Message(content, node, MessageType.EVALUATE))
        return [s.message for s in self._sent.values()]

    # --- admission ----------------------------------------------------------------------
    def _add(self, node: int, assignment: Assignment) -> None:
        self.nodes[node] = assignment
        self.history.clients[assignment.client_id] = {"num_examples": assignment.num_examples,
                                                      "weight": assignment.weight, **assignment.config}

    def _admit_new(self, grid: Grid, online: set[int]) -> None:
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

    # --- replies ------------------------------------------------------------------------
    def _answers(self, replies: Iterable[Message], round_log: RoundLog) -> Iterable[tuple[Sent, Message]]:
        """(what was sent, its reply) for each first reply to a message of this round; the
        rest (unexpected node, stale or unknown message, duplicate) logged and dropped."""
        seen: set[int] = set()
        for reply in replies:
            node = reply.metadata.src_node_id
            sent = self._sent.get(node)
            if sent is None or reply.metadata.reply_to_message_id != sent.message.metadata.message_id:
                log(WARNING, "Ignoring a reply from node %d that answers no message of round %d",
                    node, round_log.round)
                continue
            cid = sent.assignment.client_id
            if node in seen:
                round_log.rejected.setdefault(cid, "duplicate reply")
                log(WARNING, "Rejected a duplicate reply of client %s", cid)
                continue
            seen.add(node)
            if reply.has_error():
                round_log.failed[cid] = f"[{reply.error.code}] {reply.error.reason}"
                log(INFO, "Client %s did not answer: %s", cid, round_log.failed[cid])
                continue
            yield sent, reply
        for node in self._sent.keys() - seen:
            cid = self._sent[node].assignment.client_id
            round_log.failed[cid] = NO_REPLY
            log(INFO, "Client %s did not answer: %s", cid, NO_REPLY)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Weighted average of the replies that pass every check (None when none does)."""
        round_log = self.history.start_round(server_round, [s.assignment.client_id for s in self._sent.values()])
        entry = protocol.train_entry(self.run_key, server_round)
        num_params = sum(int(np.prod(a.shape)) for a in self._global.values())
        accepted: list[tuple[Assignment, ArrayRecord]] = []
        for sent, reply in self._answers(replies, round_log):
            a = sent.assignment
            bound = update_norm_bound(a.plan, a.num_examples, num_params)
            problem = check_train_reply(reply, a.charge(entry), self._global, bound)
            if problem:
                round_log.rejected[a.client_id] = problem
                log(WARNING, "Rejected update of client %s: %s", a.client_id, problem)
            else:
                accepted.append((a, reply.content.array_records[protocol.ARRAYS]))
        if self.close_round(round_log, len(accepted)) or not accepted:
            return None, None
        accepted.sort(key=lambda item: item[0].client_id)  # float sums must not depend on arrival order
        return weighted_average([(a.weight, arrays) for a, arrays in accepted]), None

    def close_round(self, round_log: RoundLog, accepted: int) -> bool:
        """Log each client's ε (summarised past ``MANY_CLIENTS``) and the round's outcome; True
        when its updates are discarded (``accept_failures`` false and a sampled client failed)."""
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
            accepted, len(round_log.rejected), len(round_log.failed))
        round_log.train_seconds = time.perf_counter() - self._round_start
        if round_log.failed and not self.accept_failures:
            round_log.discarded = (f"accept-failures = false and {len(round_log.failed)} of "
                                   f"{len(round_log.participants)} clients failed: the previous model is kept")
            log(WARNING, "Round %d: %s", round_log.round, round_log.discarded)
            return True
        return False

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Loss and accuracy from the noisy sums of the replies that pass the checks."""
        round_log = next(r for r in self.history.rounds if r.round == server_round)
        entry = protocol.evaluate_entry(self.run_key, server_round)
        sums = {protocol.COUNT: 0.0, protocol.CORRECT: 0.0, protocol.LOSS_SUM: 0.0}
        scratch = RoundLog(server_round, [])
        for sent, reply in self._answers(replies, scratch):
            problem = check_evaluate_reply(reply, sent.assignment.charge(entry, evaluate=True))
            if problem:
                scratch.rejected[sent.assignment.client_id] = problem
                continue
            reported = reply.content.metric_records[protocol.METRICS]
            for key in sums:
                value = reported[key]
                if isinstance(value, list):  # check_evaluate_reply refused it already
                    raise TypeError(f"metric {key!r} is a list, not a number")
                sums[key] += float(value)
        count = max(sums[protocol.COUNT], 1.0)
        accuracy = min(1.0, max(0.0, sums[protocol.CORRECT] / count))
        metrics = {"loss": sums[protocol.LOSS_SUM] / count, "accuracy": accuracy}
        round_log.federated_evaluation = {**metrics, "count": sums[protocol.COUNT],
                                          "failed": scratch.failed, "rejected": scratch.rejected}
        return MetricRecord(dict(metrics))  # Flower takes an (invariant) dict of its value union


def weighted_average(weighted: list[tuple[float, ArrayRecord]]) -> ArrayRecord:
    """Σ w_k θ_k / Σ w_k per array (in float64, cast back); one update is returned as it is."""
    if len(weighted) == 1:
        return weighted[0][1]
    total = sum(w for w, _ in weighted)
    first = weighted[0][1]
    out = {}
    for name, array in first.items():
        mean = np.asarray(sum(w * arrays[name].numpy().astype(np.float64) for w, arrays in weighted) / total)
        out[name] = Array(mean.astype(array.numpy().dtype))
    return ArrayRecord(out)
