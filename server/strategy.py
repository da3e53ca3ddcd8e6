"""Budget-aware FedAvg: samples only clients that can afford the round, books their events.

Invariants:
- A client is sampled only if ``ledger.can_afford(client, assigned_events)``.
- Every update the server *receives* is booked in the ledger with the events the server
  assigned (the update has been seen, whether or not it is aggregated), and the
  ledger is saved atomically before the round's model is released.
- An update is aggregated only if the client's reported events equal the assigned ones
  and its arrays match the global model (names, shapes, dtypes); otherwise it is rejected and logged.
- Refusals and failures (error replies) are logged and skipped; they book nothing.
- Nodes that connect after the start are described and admitted before the next round
  (``admit``). The ledger is keyed by client id, so a client that reconnects under a new
  node id keeps its history; a node claiming the id of a client still online is ignored.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log

from clients import protocol
from fedpriv.privacy import BudgetExceededError, PrivacyLedger
from fedpriv.privacy.events import DpEvent, EventError
from fedpriv.seeding import derive_seed
from server.history import History


@dataclass(frozen=True)
class Assignment:
    """What one client is told to run each round, and the events that implies."""

    client_id: str
    num_examples: int
    config: Mapping[str, Any]
    events: tuple[DpEvent, ...]


Admit = Callable[[Grid, list[int]], Mapping[int, Assignment]]
"""``admit(grid, node_ids)``: the assignments of those new nodes that described themselves."""


class BudgetExhausted(Exception):
    """No known client can afford another round: the run stops here."""


class BudgetedFedAvg(FedAvg):
    """FedAvg weighted by ``num-examples`` over the clients the shared ledger allows."""

    def __init__(
        self,
        ledger: PrivacyLedger,
        nodes: Mapping[int, Assignment],
        history: History,
        ledger_path: Path | None = None,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 0.0,
        seed: int = 0,
        admit: Admit | None = None,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
            min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1,
        )
        self.ledger = ledger
        self.nodes: dict[int, Assignment] = {}
        self.history = history
        for node, assignment in nodes.items():
            self._add(node, assignment)
        self.admit = admit
        self._asked: set[int] = set(self.nodes)  # nodes described once are not asked again
        self.ledger_path = ledger_path
        self.seed = seed
        self._sent: dict[int, Assignment] = {}
        self._array_spec: dict[str, tuple[tuple[int, ...], str]] = {}
        self._afford: dict[tuple[Any, ...], bool] = {}
        self._round_start = 0.0

    def summary(self) -> None:
        """Log the sampling and budget settings."""
        super().summary()
        log(INFO, "\t└──> Privacy: %d clients, budget %s", len(self.nodes), self.ledger.budget)

    def affordable(self) -> list[int]:
        """Node ids whose client can still afford its assigned round, by client id."""
        ok = [n for n, a in self.nodes.items() if self._can_afford(a)]
        return sorted(ok, key=lambda n: self.nodes[n].client_id)

    def _can_afford(self, a: Assignment) -> bool:
        """``ledger.can_afford``, memoised on (history, events, budget): clients with the
        same history share one accountant call (RDP at large q takes ~0.5 s)."""
        key = (self.ledger.events(a.client_id), a.events, self.ledger.budget_for(a.client_id))
        if key not in self._afford:
            self._afford[key] = self.ledger.can_afford(a.client_id, a.events)
        return self._afford[key]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per sampled affordable client, with its own noise multiplier."""
        self._round_start = time.perf_counter()
        online = set(grid.get_node_ids())
        self._admit_new(grid, online)
        eligible = self.affordable()
        if not eligible:
            reason = f"round {server_round}: no client can afford another round"
            log(WARNING, "Stopping: %s", reason)
            raise BudgetExhausted(reason)
        eligible = [n for n in eligible if n in online]
        size = min(len(eligible), max(1, int(len(self.nodes) * self.fraction_train)))
        rng = random.Random(derive_seed(self.seed, "server-sampling", server_round))
        sampled = sorted(rng.sample(eligible, size), key=lambda n: self.nodes[n].client_id)
        log(INFO, "configure_train: %d of %d affordable clients sampled (%d known)",
            size, len(eligible), len(self.nodes))
        self._sent = {n: self.nodes[n] for n in sampled}
        self._array_spec = _spec(arrays)
        messages = []
        for node in sampled:
            node_config = ConfigRecord({**config, **self.nodes[node].config})
            node_config[protocol.SERVER_ROUND] = server_round
            content = RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: node_config})
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def _add(self, node: int, assignment: Assignment) -> None:
        self.nodes[node] = assignment
        self.history.clients[assignment.client_id] = {"num_examples": assignment.num_examples,
                                                      **assignment.config}

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

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Book every received update, aggregate the consistent ones, save the ledger."""
        accepted = []
        round_log = self.history.start_round(server_round, [a.client_id for a in self._sent.values()])
        for reply in replies:
            assignment = self._sent.get(reply.metadata.src_node_id)
            if assignment is None:
                log(WARNING, "Ignoring reply from unexpected node %d", reply.metadata.src_node_id)
                continue
            cid = assignment.client_id
            if reply.has_error():
                round_log.failed[cid] = f"[{reply.error.code}] {reply.error.reason}"
                log(INFO, "Client %s did not train: %s", cid, round_log.failed[cid])
                continue
            try:
                self.ledger.record(cid, server_round, assignment.events)
            except BudgetExceededError as err:
                round_log.rejected[cid] = f"over budget: {err}"
                continue
            problem = self._check(reply, assignment)
            if problem:
                round_log.rejected[cid] = problem
                log(WARNING, "Rejected update of client %s: %s", cid, problem)
            else:
                accepted.append(reply)
        if self.ledger_path is not None:
            self.ledger.save(self.ledger_path)
        round_log.epsilon = {a.client_id: self.ledger.spent(a.client_id) for a in self.nodes.values()}
        for cid in sorted(round_log.participants):
            log(INFO, "\tclient %s: ε = %.4f (δ = %g)", cid, round_log.epsilon[cid], self.ledger.budget.delta)
        log(INFO, "aggregate_train: %d accepted, %d rejected, %d refused or failed",
            len(accepted), len(round_log.rejected), len(round_log.failed))
        # In client order: float sums must not depend on which reply arrived first.
        accepted.sort(key=lambda m: self._sent[m.metadata.src_node_id].client_id)
        arrays, metrics = super().aggregate_train(server_round, accepted)
        round_log.train_metrics = dict(metrics or {})
        round_log.train_seconds = time.perf_counter() - self._round_start
        return arrays, metrics

    def _check(self, reply: Message, assignment: Assignment) -> str | None:
        """Why an update cannot be aggregated, or ``None`` when it can."""
        content = reply.content
        if protocol.PRIVACY not in content.config_records:
            return "no privacy record in reply"
        try:
            reported = protocol.read_events(content.config_records[protocol.PRIVACY])
        except EventError as err:
            return f"unreadable events: {err}"
        if reported != assignment.events:
            return f"reported events {reported} differ from the assigned {assignment.events}"
        if list(content.array_records) != [protocol.ARRAYS]:
            return f"expected one ArrayRecord '{protocol.ARRAYS}'"
        if _spec(content.array_records[protocol.ARRAYS]) != self._array_spec:
            return "arrays do not match the global model's names, shapes and dtypes"
        metrics = content.metric_records.get(protocol.METRICS)
        if metrics is None or len(content.metric_records) != 1:
            return f"expected one MetricRecord '{protocol.METRICS}'"
        if set(metrics.keys()) != protocol.TRAIN_METRICS:
            return f"metrics must be exactly {sorted(protocol.TRAIN_METRICS)}"
        weight = metrics[protocol.NUM_EXAMPLES]
        if isinstance(weight, list) or weight <= 0:
            return f"'{protocol.NUM_EXAMPLES}' must be a positive number"
        return None


def _spec(arrays: ArrayRecord) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: (tuple(array.shape), str(array.dtype)) for name, array in arrays.items()}
