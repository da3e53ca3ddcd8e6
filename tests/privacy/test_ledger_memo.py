"""The ledger's speed-ups (leaf counts kept per client, ε memoised per merged event, the
file's text joined from per-entry text, the store's parsed ledger reused) change no
privacy decision: spent ε and budget refusals equal dp-accounting's on the composed events
(computed here, not through the ledger), no memo answers for a history it was not computed
on, a failed transaction leaves nothing behind, and the file is ``json.dumps(..., indent=1)``
of the ledger as before. No wall-clock assertions: scaling is checked by counting the
accountants the ledger makes."""

from __future__ import annotations

import functools
import json

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant as DpaRdp

import fedpriv.privacy.ledger as ledger_module
from fedpriv.privacy import Budget, BudgetExceededError, PrivacyLedger
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.privacy.events import ComposedEvent, GaussianEvent, LaplaceEvent, SelfComposedEvent
from fedpriv.privacy.store import LedgerStore
from fedpriv.privacy.userlevel import user_round_event
from server.ledger import ServerLedger

DELTA = 1e-5
A = (0.1, 1.09)  # (sample_rate, noise_multiplier): the user-level round of 1,000 clients
B = (0.05, 2.0)


def event(leaf: tuple[float, float]):
    return user_round_event(*leaf)


@functools.cache
def reference(counts: tuple[tuple[tuple[float, float], int], ...], delta: float = DELTA) -> float:
    """ε of Poisson-sampled Gaussians run ``n`` times each, by dp-accounting's own RDP
    accountant on fedpriv's order grid."""
    accountant = DpaRdp(orders=list(ORDERS))
    for (q, sigma), n in counts:
        accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), n)
    return accountant.get_epsilon(delta)


def history(leaves: list[tuple[float, float]]) -> tuple[tuple[tuple[float, float], int], ...]:
    """[(leaf, count)] in first-seen order."""
    counts: dict[tuple[float, float], int] = {}
    for leaf in leaves:
        counts[leaf] = counts.get(leaf, 0) + 1
    return tuple(counts.items())


@pytest.fixture(autouse=True)
def cold_memo():
    ledger_module._epsilon_of.cache_clear()
    yield
    ledger_module._epsilon_of.cache_clear()


@pytest.fixture
def accountant_calls(monkeypatch):
    """How many accountants the ledger makes (each one is an ε computation)."""
    calls = []
    real = ledger_module.make_accountant

    def counting(kind):
        calls.append(kind)
        return real(kind)

    monkeypatch.setattr(ledger_module, "make_accountant", counting)
    return calls


def test_rounds_of_different_histories_book_and_refuse_as_dp_accounting_says(tmp_path):
    """Three clients of different histories, one transaction per round in a durable
    ServerLedger (as user level books): client "a" reaches its budget exactly at round 5
    (ε = budget is still within it), is refused from round 6 on; each booking, refusal and
    spent ε is dp-accounting's on the client's booked events plus the new one."""
    plans = {"a": [A] * 8, "b": [B] * 8, "c": [A, B] * 4, "d": [B, A, A, B, A, A, A, B]}
    budget = Budget(epsilon=reference(history([A] * 5)), delta=DELTA)
    ledger = ServerLedger(budget, tmp_path / "ledger.json")
    booked: dict[str, list[tuple[float, float]]] = {c: [] for c in plans}
    refusals = []
    for r in range(8):
        with ledger.transaction() as book:
            for client, plan in plans.items():
                expected_ok = reference(history(booked[client] + [plan[r]])) <= budget.epsilon
                try:
                    book.record(client, f"run/round-{r + 1}/train", (event(plan[r]),))
                except BudgetExceededError:
                    assert not expected_ok, (client, r)
                    refusals.append((client, r + 1))
                    continue
                assert expected_ok, (client, r)
                booked[client].append(plan[r])
                assert book.spent(client) == reference(history(booked[client]))
    assert [r for c, r in refusals if c == "a"] == [6, 7, 8]
    assert any(c == "d" for c, _ in refusals)
    reloaded = ServerLedger(budget, tmp_path / "ledger.json").snapshot()  # another process
    for client in plans:
        assert reloaded.events(client) == tuple(event(leaf) for leaf in booked[client])
        assert reloaded.spent(client) == reference(history(booked[client]))


def test_no_memo_answers_for_a_history_that_differs_in_one_event():
    """Clients whose histories differ only in their last event (or in its parameters, or in
    the order of first appearance) get their own ε, and a client's ε follows each record."""
    ledger = PrivacyLedger(Budget(epsilon=100.0, delta=DELTA))
    histories = {"same": [A, A, A], "last": [A, A, B], "sigma": [A, A, (0.1, 1.1)], "order": [B, A, A]}
    for client, leaves in histories.items():
        for r, leaf in enumerate(leaves):
            ledger.record(client, str(r), event(leaf))
            assert ledger.spent(client) == reference(history(leaves[:r + 1]))
    values = {client: ledger.spent(client) for client in histories}
    assert len({values["same"], values["last"], values["sigma"]}) == 3  # a memo ignoring an event would merge two
    for client, leaves in histories.items():
        assert values[client] == reference(history(leaves))
    assert ledger.spent_at("same", 1e-3) == reference(history(histories["same"]), 1e-3)  # δ is in the key


def test_memo_keeps_accountant_kinds_apart():
    """The same events under another accountant kind are another ε (PLD's, not RDP's)."""
    rdp = PrivacyLedger(Budget(epsilon=100.0, delta=DELTA), "rdp")
    pld = PrivacyLedger(Budget(epsilon=100.0, delta=DELTA), "pld")
    for ledger in (rdp, pld):
        for r in range(3):
            ledger.record("c", str(r), event(B))
    assert rdp.spent("c") == reference(history([B] * 3))
    theirs = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    theirs.compose(dp_accounting.PoissonSampledDpEvent(B[0], dp_accounting.GaussianDpEvent(B[1])), 3)
    assert pld.spent("c") == pytest.approx(theirs.get_epsilon(DELTA), rel=1e-9)
    assert pld.spent("c") != rdp.spent("c")


def test_one_accountant_per_distinct_history_and_round_whatever_the_round(tmp_path, accountant_calls):
    """1,000 clients with the same history cost one ε computation a round (the new
    history's; the old one's is remembered from the round before), at round 1 as at round
    12; two distinct histories cost two. Before the memo: 2 per client and round."""
    clients = [str(i) for i in range(1000)]
    ledger = ServerLedger(Budget(epsilon=100.0, delta=DELTA), tmp_path / "ledger.json")
    per_round = []
    for r in range(1, 13):
        before = len(accountant_calls)
        with ledger.transaction() as book:
            for i, client in enumerate(clients):
                book.record(client, f"run/round-{r}/train", (event(A if i % 2 or r < 4 else B),))
        per_round.append(len(accountant_calls) - before)
    assert per_round == [1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2]


def test_a_failed_transaction_leaves_no_entry_in_the_store_reused_ledger(tmp_path):
    """The store reuses its parsed ledger between transactions: entries made in a block
    that raised must not reappear in the next transaction (no double-booked round, no ε
    spent twice), and entries of one that completed must (none lost)."""
    store = LedgerStore(tmp_path / "ledger.json")
    budget = Budget(epsilon=100.0, delta=DELTA)
    with store.transaction(budget) as ledger:
        ledger.record("c", "round-1", event(A))
    with pytest.raises(RuntimeError), store.transaction(budget) as ledger:
        ledger.record("c", "round-2", event(A))
        raise RuntimeError("crash before the save")
    with store.transaction(budget) as ledger:
        assert ledger.entries("c") == {"round-1": (event(A),)}
        assert ledger.spent("c") == reference(history([A]))
        ledger.record("c", "round-2", event(B))  # another round-2 now books without a conflict
    assert LedgerStore(tmp_path / "ledger.json").read().spent("c") == reference(history([A, B]))


def test_another_writer_between_transactions_is_seen(tmp_path):
    """Another process's transaction changes the file's bytes; the next transaction of the
    first store reads them (its budget check sees the other's spending)."""
    path = tmp_path / "ledger.json"
    budget = Budget(epsilon=reference(history([A, A])), delta=DELTA)
    mine, theirs = LedgerStore(path), LedgerStore(path)
    with mine.transaction(budget) as ledger:
        ledger.record("c", "mine-1", event(A))
    with theirs.transaction(budget) as ledger:
        ledger.record("c", "theirs-1", event(A))
    with mine.transaction(budget) as ledger:
        assert list(ledger.entries("c")) == ["mine-1", "theirs-1"]
        with pytest.raises(BudgetExceededError):
            ledger.record("c", "mine-2", event(A))


LEDGERS = {
    "empty": [],
    "user rounds": [("1", f"run/round-{r}/train", (event(A),)) for r in range(3)] + [("10", "x", (event(B),))],
    "odd names and events": [
        ('quote"and\\slash', "ünïcødé/\u2603", (LaplaceEvent(2), ComposedEvent(()))),
        ("c\nnewline", "e", ()),
        ("c\nnewline", "f", (SelfComposedEvent(GaussianEvent(3), 0), GaussianEvent(1.5))),
    ],
}


@pytest.mark.parametrize("records", LEDGERS.values(), ids=LEDGERS.keys())
def test_file_is_json_dumps_of_the_ledger_with_indent_1(tmp_path, records):
    """The format is unchanged: after every transaction the file's bytes are
    ``json.dumps(to_dict(), indent=1)`` (what the ledger wrote before), also for a ledger
    extended in several saves and for header changes."""
    path = tmp_path / "ledger.json"
    store = LedgerStore(path)
    for i, (client, entry, events) in enumerate(records):
        with store.transaction(Budget(epsilon=100.0 + i, delta=DELTA)) as ledger:
            ledger.record(client, entry, events)
            if i == 1:
                ledger.client_budgets["z"] = Budget(1.0, 1e-6)
                ledger.ledger_id = "node-1"
        assert path.read_bytes() == json.dumps(ledger.to_dict(), indent=1).encode("utf-8")
    ledger = LedgerStore(path).read(Budget(epsilon=1.0, delta=DELTA)) if records else PrivacyLedger(
        Budget(epsilon=1.0, delta=DELTA))
    assert ledger.to_json() == json.dumps(ledger.to_dict(), indent=1)
    saved = tmp_path / "saved.json"
    ledger.save(saved)
    assert PrivacyLedger.load(saved) == ledger


def test_no_change_no_write(tmp_path):
    """A transaction that books nothing leaves the file untouched (same inode: not replaced)."""
    path = tmp_path / "ledger.json"
    store = LedgerStore(path)
    with store.transaction(Budget(epsilon=10.0, delta=DELTA)) as ledger:
        ledger.record("c", "1", event(A))
    inode = path.stat().st_ino
    with store.transaction(Budget(epsilon=10.0, delta=DELTA)) as ledger:
        assert ledger.can_afford("c", event(A))
    assert path.stat().st_ino == inode


def test_copy_shares_nothing_mutable():
    """A copy's records do not reach the original (its entries, spent ε or saved text)."""
    original = PrivacyLedger(Budget(epsilon=100.0, delta=DELTA))
    original.record("c", "1", event(A))
    text = original.to_json()
    copy = original.copy()
    copy.record("c", "2", event(A))
    copy.record("d", "1", event(B))
    copy.client_budgets["c"] = Budget(1.0, DELTA)
    assert original.entries("c") == {"1": (event(A),)} and original.clients() == ["c"]
    assert original.spent("c") == reference(history([A]))
    assert original.to_json() == text
    assert copy.spent("c") == reference(history([A, A]))
    assert copy == PrivacyLedger.from_json(copy.to_json())
