"""Before Ray starts: can any simulated client still afford a round in ``--state-dir``?

A federation whose budgets an earlier run spent would otherwise start Ray, describe every
node, find that none can afford round 1, and end with the initial model. Here the command
asks the same questions the run would, of the same ledgers, without Ray: each simulated
node's partition size (``clients.task.local_data``, as the node computes it when it
describes itself), the plan the server would assign (``server.assign.Assigner``), then
whether the server's ledger (``state-dir/ledger.json``) and the node's own ledger
(``state-dir/nodes/<i>/ledger.json``, under its policy) can each afford one round of it.

Where the nodes release a DP count of N (``--num-examples-noise``) the N the server plans
with is the node's draw, so the question is left to the run. A resumed run is left to it too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedpriv.federation.policy import NodePolicy, load_policy
from fedpriv.federation.settings import PrivacyMode, RunSettings
from fedpriv.privacy import AccountantKind, Budget, PrivacyLedger
from fedpriv.privacy.events import DpEvent
from fedpriv.privacy.store import LedgerStore

SERVER_FLAG = "--epsilon-budget"
NODE_FLAG = "--client-epsilon-budget (the nodes' policy key epsilon-budget)"


@dataclass(frozen=True)
class Shortfall:
    """One client's ledger that cannot afford a round: where, spent ε, ε after one more round, budget."""

    path: Path
    client: str
    spent: float
    after: float
    budget: Budget


def nothing_to_spend(settings: RunSettings, state_dir: Path, clients: int) -> str | None:
    """Why no simulated client can afford round 1 of this run, in one line naming the budget
    that is spent and the flag that raises it; None if one can (or the run must find out).
    The nodes' policy is the one ``$FEDPRIV_NODE_POLICY`` names (``node_policy_env``)."""
    server_path = state_dir / "ledger.json"
    configs = [{"partition-id": i, "num-partitions": clients} for i in range(clients)]
    policies = [load_policy(config) for config in configs]
    if settings.privacy is not PrivacyMode.LOCAL:  # its events are the run's to compute (server.distributed)
        return None
    if settings.resume or not any(_holds_entries(path) for path in (server_path, *(p.ledger_path for p in policies))):
        return None
    if not all(p.public_num_examples for p in policies):
        return None
    events = round_events(settings, policies, configs)
    server_budget = Budget(epsilon=settings.server_budget, delta=settings.delta)
    server, nodes = [], []
    for i, policy in enumerate(policies):
        client = str(i)
        on_server = shortfall(server_path, client, events[client], server_budget, AccountantKind.RDP)
        on_node = shortfall(policy.ledger_path, client, events[client], policy.effective_budget(settings),
                            policy.accountant)
        if on_server is None and on_node is None:
            return None
        server.append(on_server)
        nodes.append(on_node)
    if all(server):
        return explain("in the server's ledger", server, SERVER_FLAG)  # type: ignore[arg-type]
    return explain("in the nodes' own ledgers", [s for s in nodes if s], NODE_FLAG)


def round_events(settings: RunSettings, policies: list[NodePolicy], configs: Sequence[Mapping[str, int]]
                 ) -> dict[str, tuple[DpEvent, ...]]:
    """Client id → the events of one round the server would assign it (its N public)."""
    from clients.task import local_data
    from server.assign import Assigner
    from server.discovery import ClientInfo

    infos = {i: ClientInfo(str(i), len(local_data(settings, config, policy.data_dir,
                                                  partition_key=policy.partition_key).labels))
             for i, (policy, config) in enumerate(zip(policies, configs, strict=True))}
    return {a.client_id: a.events for a in Assigner(settings, infos)(infos).values()}


def shortfall(path: Path, client: str, events: tuple[DpEvent, ...], budget: Budget,
              accountant: AccountantKind) -> Shortfall | None:
    """How ``client``'s ledger at ``path`` falls short of one round of ``events`` under
    ``budget``; None if it can afford it (no file: nothing spent)."""
    if not path.exists():
        return None
    with LedgerStore(path).transaction(budget, accountant) as ledger:
        if ledger.can_afford(client, events, budget=budget):
            return None
        trial = PrivacyLedger.from_dict(ledger.to_dict())
    trial.record(client, "next-round", events, budget=Budget(epsilon=math.inf, delta=budget.delta))
    return Shortfall(path, client, ledger.spent_at(client, budget.delta), trial.spent_at(client, budget.delta),
                     budget)


def explain(where: str, shortfalls: list[Shortfall], flag: str) -> str:
    """One line: whose budget is spent, by how much a round misses it, and what raises it."""
    first = shortfalls[0]
    return (f"nothing left to spend: every client's ε budget {where} is spent (client {first.client} in "
            f"{first.path}: ε = {first.spent:.4f} of {first.budget.epsilon:g} at δ = {first.budget.delta:g}, one "
            f"more round would take it to {first.after:.4f}); raise the budget with {flag}, or use a new --state-dir")


def _holds_entries(path: Path) -> bool:
    """Has anything been booked in the ledger at ``path`` (a fresh node's initialised ledger
    holds none)?"""
    return path.exists() and bool(PrivacyLedger.load(path).clients())


def node_epsilon(state_dir: Path, clients: int, delta: float) -> dict[str, float]:
    """Each simulated client's ε at ``delta`` by its node's own ledger (the guarantee; the
    server's ledger holds only what it booked). The nodes' policy is ``$FEDPRIV_NODE_POLICY``'s."""
    spent = {}
    for i in range(clients):
        policy = load_policy({"partition-id": i, "num-partitions": clients})
        spent[str(i)] = LedgerStore(policy.ledger_path).read(budget=policy.budget).spent_at(str(i), delta)
    return spent
