"""One contract for every ledger backend: the in-memory ledger of a run, the locked file, the
server's durable ledger and a node's initialised ledger (checked before each transaction).

Each backend is driven through the same two verbs, ``transaction()`` (check and book,
kept only if the block completes) and ``reopen()`` (a fresh handle on the same ledger, as
a restarted process gets). ε is checked against dp-accounting's own RDP accountant, never
against the ledger's arithmetic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dp_accounting
import pytest

from fedpriv.federation.policy import NodePolicy, load_policy
from fedpriv.node import check_ledger, init
from fedpriv.privacy import Budget, BudgetExceededError, LedgerError, PrivacyLedger, dpsgd_event
from fedpriv.privacy.store import LedgerStore
from server.ledger import ServerLedger

BUDGET = Budget(epsilon=2.0, delta=1e-5)
SIGMA, Q, STEPS = 1.1, 0.01, 400
EVENT = dpsgd_event(SIGMA, Q, STEPS)


def reference_epsilon(rounds: int, delta: float = BUDGET.delta) -> float:
    """ε of ``rounds`` bookings of ``EVENT`` by dp-accounting's RDP accountant."""
    accountant = dp_accounting.rdp.RdpAccountant()
    sampled = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA))
    accountant.compose(dp_accounting.SelfComposedDpEvent(sampled, STEPS * rounds))
    return accountant.get_epsilon(delta)


@dataclass
class Backend:
    """A ledger behind ``transaction``, and how a restarted process opens it again."""

    transaction: Callable[[], contextlib.AbstractContextManager[PrivacyLedger]]
    reopen: Callable[[], Backend]
    durable: bool


def memory_backend() -> Backend:
    ledger = ServerLedger(BUDGET)
    backend = Backend(ledger.transaction, lambda: backend, durable=False)
    return backend


def file_backend(path: Path) -> Backend:
    store = LedgerStore(path)
    return Backend(lambda: store.transaction(BUDGET), lambda: file_backend(path), durable=True)


def server_backend(path: Path) -> Backend:
    ledger = ServerLedger(BUDGET, path)
    return Backend(ledger.transaction, lambda: server_backend(path), durable=True)


def node_backend(policy: NodePolicy) -> Backend:
    """A node's ledger as its handlers use it: checked (initialised, present, its own), then locked."""
    def transaction() -> contextlib.AbstractContextManager[PrivacyLedger]:
        check_ledger(policy)
        return LedgerStore(policy.ledger_path).transaction(BUDGET, policy.accountant)

    return Backend(transaction, lambda: node_backend(policy), durable=True)


def initialised_node(folder: Path) -> NodePolicy:
    policy_file = folder / "policy.toml"
    folder.mkdir(parents=True)
    policy_file.write_text(f'epsilon-budget = {BUDGET.epsilon}\nstate-dir = "state"\n')
    policy = load_policy({"policy": str(policy_file)}, environ={})
    init(policy)
    return policy


@pytest.fixture(params=["memory", "locked-file", "server-durable", "node"])
def backend(request, tmp_path) -> Backend:
    path = tmp_path / "ledger.json"
    return {"memory": memory_backend, "locked-file": lambda: file_backend(path),
            "server-durable": lambda: server_backend(path),
            "node": lambda: node_backend(initialised_node(tmp_path / "node"))}[request.param]()


def rounds_that_fit() -> int:
    """How many bookings of ``EVENT`` fit ``BUDGET``, by the reference alone."""
    rounds = 0
    while reference_epsilon(rounds + 1) <= BUDGET.epsilon:
        rounds += 1
    assert 1 <= rounds < 20, "the contract needs a budget that a few rounds exhaust"
    return rounds


def test_books_what_the_budget_affords_and_refuses_the_rest_unchanged(backend):
    fits = rounds_that_fit()
    for r in range(fits):
        with backend.transaction() as ledger:
            assert ledger.can_afford("0", [EVENT])
            assert ledger.record("0", f"round-{r}", [EVENT])
    with backend.transaction() as ledger:
        assert not ledger.can_afford("0", [EVENT])
        with pytest.raises(BudgetExceededError):
            ledger.record("0", f"round-{fits}", [EVENT])
        assert len(ledger.entries("0")) == fits
    with backend.reopen().transaction() as ledger:
        assert len(ledger.entries("0")) == fits
        # the ledger's ε is an upper bound no looser than 1 % above the reference's
        spent = ledger.spent_at("0", BUDGET.delta)
        assert reference_epsilon(fits) * (1 - 1e-9) <= spent <= reference_epsilon(fits) * 1.01


def test_an_entry_is_charged_once_and_never_rewritten(backend):
    with backend.transaction() as ledger:
        assert ledger.record("0", "run/round-1/train", [EVENT])
    with backend.transaction() as ledger:
        assert not ledger.record("0", "run/round-1/train", [EVENT])  # a retried report
        with pytest.raises(LedgerError, match="different events"):
            ledger.record("0", "run/round-1/train", [dpsgd_event(SIGMA / 2, Q, STEPS)])
        assert ledger.spent_at("0", BUDGET.delta) == pytest.approx(reference_epsilon(1), rel=1e-2)


def test_a_failed_transaction_leaves_no_trace(backend):
    with pytest.raises(RuntimeError, match="crash"), backend.transaction() as ledger:
        ledger.record("0", "run/round-1/train", [EVENT])
        raise RuntimeError("crash after booking, before the block completed")
    with backend.reopen().transaction() as ledger:
        assert ledger.entries("0") == {}


def test_clients_are_charged_separately(backend):
    with backend.transaction() as ledger:
        ledger.record("0", "run/round-1/train", [EVENT])
        ledger.record("1", "run/round-1/train", [EVENT, EVENT])
    with backend.reopen().transaction() as ledger:
        assert ledger.spent_at("0", BUDGET.delta) == pytest.approx(reference_epsilon(1), rel=1e-2)
        assert ledger.spent_at("1", BUDGET.delta) == pytest.approx(reference_epsilon(2), rel=1e-2)


def test_only_durable_backends_outlive_their_process(backend):
    with backend.transaction() as ledger:
        ledger.record("0", "run/round-1/train", [EVENT])
    if not backend.durable:
        pytest.skip("the in-memory ledger lasts one run by design")
    with backend.reopen().transaction() as ledger:
        assert ledger.has_entry("0", "run/round-1/train")
