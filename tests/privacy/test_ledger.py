"""PrivacyLedger: entry keys, merging, idempotency, budgets, atomic persistence, the v1
migration, corrupt files."""

import json
import os

import pytest

from fedpriv.privacy import (
    AccountantKind,
    Budget,
    BudgetExceededError,
    ComposedEvent,
    GaussianEvent,
    LaplaceEvent,
    LedgerError,
    PrivacyLedger,
    dpsgd_event,
    epsilon_of,
    event_to_dict,
)
from fedpriv.privacy.ledger_json import SCHEMA_VERSION
from fedpriv.privacy.merge import merge_events


def test_entries_merge_bit_for_bit():
    ledger = PrivacyLedger(Budget(10.0, 1e-5), "rdp")
    for r in range(1, 6):
        assert ledger.record("c1", f"run-1/round-{r}/train", [dpsgd_event(1.1, 0.01, 600)])
    assert merge_events(ledger.events("c1")) == dpsgd_event(1.1, 0.01, 3000)
    assert ledger.spent("c1") == epsilon_of(dpsgd_event(1.1, 0.01, 3000), 1e-5, "rdp")
    assert ledger.remaining("c1") == 10.0 - ledger.spent("c1")
    assert ledger.spent("unknown") == 0.0


def test_entries_keep_recorded_order():
    ledger = PrivacyLedger(Budget(100.0, 1e-5), "zcdp")
    keys = ["run-b/round-10/train", "release/num-examples/ab12", "run-a/round-2/train", "10", "2"]
    for i, key in enumerate(keys):
        ledger.record("c", key, LaplaceEvent(10.0 + i))
    assert list(ledger.entries("c")) == keys  # chronological, not sorted
    assert ledger.events("c") == tuple(LaplaceEvent(10.0 + i) for i in range(len(keys)))
    assert ledger.has_entry("c", "10") and not ledger.has_entry("c", "run-b") and not ledger.has_entry("x", "10")
    copy = ledger.entries("c")
    copy.clear()
    assert len(ledger.entries("c")) == len(keys)
    loaded = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert list(loaded.entries("c")) == keys and loaded == ledger
    assert not hasattr(ledger, "rounds")


@pytest.mark.parametrize("entry, error", [(1, TypeError), (None, TypeError), (b"x", TypeError), ("", ValueError)])
def test_entry_keys_are_non_empty_strings(entry, error):
    ledger = PrivacyLedger(Budget(10.0, 1e-5))
    with pytest.raises(error):
        ledger.record("c", entry, LaplaceEvent(10.0))
    with pytest.raises(TypeError):
        ledger.record(3, "e", LaplaceEvent(10.0))
    assert ledger.clients() == []


def test_record_is_idempotent_per_entry():
    ledger = PrivacyLedger(Budget(10.0, 1e-5), "zcdp")
    assert ledger.record("c1", "r/1", dpsgd_event(2.0, 0.01, 10))
    spent = ledger.spent("c1")
    assert ledger.record("c1", "r/1", dpsgd_event(2.0, 0.01, 10)) is False
    assert ledger.spent("c1") == spent
    with pytest.raises(LedgerError, match="different events"):
        ledger.record("c1", "r/1", dpsgd_event(3.0, 0.01, 10))
    assert ledger.spent("c1") == spent and len(ledger.entries("c1")) == 1
    assert ledger.record("c2", "r/1", dpsgd_event(3.0, 0.01, 10))  # keys are per client


def test_budget_exceeded_leaves_ledger_untouched():
    ledger = PrivacyLedger(Budget(3.0, 1e-5), "zcdp", client_budgets={"vip": Budget(100.0, 1e-5)})
    ledger.record("c1", "a", LaplaceEvent(2.0))
    before = ledger.to_dict()
    assert not ledger.can_afford("c1", [dpsgd_event(1.0, 0.1, 100)])
    with pytest.raises(BudgetExceededError, match=r"client 'c1'.*budget epsilon 3"):
        ledger.record("c1", "b", [dpsgd_event(1.0, 0.1, 100)])
    assert ledger.to_dict() == before and not ledger.has_entry("c1", "b")
    assert ledger.can_afford("vip", [dpsgd_event(1.0, 0.1, 100)])
    assert ledger.record("vip", "b", [dpsgd_event(1.0, 0.1, 100)])


def test_budget_override_for_one_check():
    # basic composition: Laplace(1/ε) events add up exactly, whatever δ.
    ledger = PrivacyLedger(Budget(10.0, 1e-5), "basic")
    ledger.record("c", "a", LaplaceEvent(1.0))  # ε = 1
    tight = Budget(1.5, 1e-6)
    assert ledger.can_afford("c", LaplaceEvent(1.0))
    assert not ledger.can_afford("c", LaplaceEvent(1.0), budget=tight)
    before = ledger.to_dict()
    with pytest.raises(BudgetExceededError, match="budget epsilon 1.5"):
        ledger.record("c", "b", LaplaceEvent(1.0), budget=tight)
    assert ledger.to_dict() == before
    assert ledger.record("c", "b", LaplaceEvent(2.0), budget=tight)  # ε 1 + 0.5 fits exactly
    # a looser override is not capped by the ledger's own budget
    assert ledger.can_afford("c", LaplaceEvent(0.1), budget=Budget(20.0, 1e-5))
    assert not ledger.can_afford("c", LaplaceEvent(0.1))
    with pytest.raises(TypeError):
        ledger.can_afford("c", LaplaceEvent(1.0), budget=(1.0, 1e-5))


def test_override_uses_its_delta_and_keeps_spent_cache_correct():
    event = dpsgd_event(1.1, 0.01, 600)
    ledger = PrivacyLedger(Budget(100.0, 1e-5), "rdp")
    ledger.record("c", "a", event)
    at_own = epsilon_of(event, 1e-5, "rdp")
    at_other = epsilon_of(event, 1e-3, "rdp")
    assert at_other < at_own
    assert ledger.spent("c") == at_own
    # ε at the override's δ: a budget between the two ε only fits at δ = 1e-3
    between = (at_own + at_other) / 2
    assert not ledger.can_afford("c", [], budget=Budget(between, 1e-5))
    assert ledger.can_afford("c", [], budget=Budget(between, 1e-3))
    # recording under another δ must not pollute spent() (at the budget's own δ)
    ledger.record("c", "b", event, budget=Budget(100.0, 1e-3))
    both = dpsgd_event(1.1, 0.01, 1200)
    assert ledger.spent("c") == epsilon_of(both, 1e-5, "rdp")
    assert ledger.spent_at("c", 1e-3) == epsilon_of(both, 1e-3, "rdp")
    assert ledger.spent_at("c", 1e-5) == ledger.spent("c")
    ledger.record("c", "c", event, budget=Budget(100.0, 1e-3))
    assert ledger.spent("c") == epsilon_of(dpsgd_event(1.1, 0.01, 1800), 1e-5, "rdp")
    with pytest.raises(ValueError):
        ledger.spent_at("c", 0.0)


def test_spent_follows_budget_and_accountant_changes():
    event = dpsgd_event(1.1, 0.01, 600)
    ledger = PrivacyLedger(Budget(100.0, 1e-5), "rdp")
    ledger.record("c", "a", event)
    assert ledger.spent("c") == epsilon_of(event, 1e-5, "rdp")
    ledger.budget = Budget(100.0, 1e-3)
    assert ledger.spent("c") == epsilon_of(event, 1e-3, "rdp")
    ledger.accountant = AccountantKind("zcdp")
    assert ledger.spent("c") == epsilon_of(event, 1e-3, "zcdp")


def test_heterogeneous_events_merge():
    merged = merge_events([ComposedEvent((LaplaceEvent(1.0), dpsgd_event(2.0, 0.1, 3))), dpsgd_event(2.0, 0.1, 4)])
    assert merged == ComposedEvent((dpsgd_event(1.0, 1.0, 1).__class__(LaplaceEvent(1.0), 1), dpsgd_event(2.0, 0.1, 7)))


def test_save_load_round_trip(tmp_path):
    ledger = PrivacyLedger(Budget(5.0, 1e-6), "pld", client_budgets={"b": Budget(1.0, 1e-5)})
    ledger.record("a", "run-3f2a/round-2/train", dpsgd_event(1.5, 0.02, 50))
    ledger.record("b", "z", [LaplaceEvent(4.0), dpsgd_event(2.0, 0.05, 10)])
    ledger.record("b", "a", GaussianEvent(20.0))
    path = tmp_path / "ledger.json"
    ledger.save(path)
    assert os.listdir(tmp_path) == ["ledger.json"]
    data = json.loads(path.read_text())
    assert data["version"] == SCHEMA_VERSION == 2 and data["accountant"] == "pld"
    assert [e["entry"] for e in data["clients"]["b"]] == ["z", "a"]
    assert data["clients"]["a"] == [{"entry": "run-3f2a/round-2/train",
                                     "events": [event_to_dict(dpsgd_event(1.5, 0.02, 50))]}]
    loaded = PrivacyLedger.load(path)
    assert loaded == ledger
    assert list(loaded.entries("b")) == ["z", "a"]
    assert loaded.spent("a") == ledger.spent("a")


V1 = {
    "schema": "fedpriv.privacy.ledger",
    "version": 1,
    "accountant": "rdp",
    "budget": {"epsilon": 8.0, "delta": 1e-5},
    "client_budgets": {"1": {"epsilon": 2.0, "delta": 1e-5}},
    "clients": {
        "0": [
            {"round": 1, "events": [{"type": "laplace", "noise_multiplier": 10.0}]},
            {"round": 2, "events": [{"type": "laplace", "noise_multiplier": 20.0}]},
            {"round": 10, "events": [{"type": "laplace", "noise_multiplier": 30.0}]},
        ],
        "1": [{"round": 3, "events": []}],
    },
}


def test_reads_version_1_files(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(V1))
    ledger = PrivacyLedger.load(path)
    assert ledger.entries("0") == {"1": (LaplaceEvent(10.0),), "2": (LaplaceEvent(20.0),), "10": (LaplaceEvent(30.0),)}
    assert list(ledger.entries("0")) == ["1", "2", "10"]  # round order, not string order
    assert ledger.entries("1") == {"3": ()}
    assert ledger.budget_for("1") == Budget(2.0, 1e-5) and ledger.budget == Budget(8.0, 1e-5)
    three = ComposedEvent((LaplaceEvent(10.0), LaplaceEvent(20.0), LaplaceEvent(30.0)))
    assert ledger.spent("0") == epsilon_of(three, 1e-5, "rdp")
    assert ledger.record("0", "2", LaplaceEvent(20.0)) is False  # a retried old round is still idempotent
    ledger.save(path)
    migrated = json.loads(path.read_text())
    assert migrated["version"] == 2
    assert migrated["clients"]["0"] == [
        {"entry": "1", "events": [{"type": "laplace", "noise_multiplier": 10.0}]},
        {"entry": "2", "events": [{"type": "laplace", "noise_multiplier": 20.0}]},
        {"entry": "10", "events": [{"type": "laplace", "noise_multiplier": 30.0}]},
    ]
    assert PrivacyLedger.load(path) == ledger
    shuffled = json.loads(json.dumps(V1))
    shuffled["clients"]["0"].reverse()
    assert list(PrivacyLedger.from_dict(shuffled).entries("0")) == ["1", "2", "10"]


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda d: d["clients"]["0"].append({"round": 2, "events": []}), "twice"),
        (lambda d: d["clients"]["0"][0].update(round="1"), "round"),
        (lambda d: d["clients"]["0"][0].update(round=-1), "round"),
        (lambda d: d["clients"]["0"][0].update(entry="1") or d["clients"]["0"][0].pop("round"), "corrupt"),
    ],
)
def test_corrupt_version_1_entries(change, match):
    data = json.loads(json.dumps(V1))
    change(data)
    with pytest.raises(LedgerError, match=match):
        PrivacyLedger.from_dict(data)


@pytest.mark.parametrize(
    "entries, match",
    [
        ([{"entry": "a", "events": []}, {"entry": "a", "events": []}], "twice"),
        ([{"entry": "", "events": []}], "non-empty"),
        ([{"entry": 3, "events": []}], "str"),
        ([{"round": 3, "events": []}], "corrupt"),
        ([{"entry": "a", "events": {"type": "laplace"}}], "list"),
        (["a"], "object"),
    ],
)
def test_corrupt_version_2_entries(entries, match):
    data = PrivacyLedger(Budget(1.0, 1e-5)).to_dict() | {"clients": {"c": entries}}
    with pytest.raises(LedgerError, match=match):
        PrivacyLedger.from_dict(data)


def test_crash_mid_write_keeps_old_file(tmp_path, monkeypatch):
    ledger = PrivacyLedger(Budget(50.0, 1e-5), "zcdp")
    path = tmp_path / "ledger.json"
    ledger.save(path)
    old = path.read_text()
    ledger.record("a", "1", dpsgd_event(2.0, 0.01, 10))

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        ledger.save(path)
    assert path.read_text() == old
    assert os.listdir(tmp_path) == ["ledger.json"]


@pytest.mark.parametrize(
    "content, match",
    [("{not json", "invalid JSON"), ('{"schema": "other"}', "not a fedpriv"),
     ('{"schema": "fedpriv.privacy.ledger", "version": 99}', "version"),
     ('{"schema": "fedpriv.privacy.ledger", "version": "2"}', "version"),
     ('{"schema": "fedpriv.privacy.ledger", "version": 2, "accountant": "rdp"}', "corrupt"),
     ('{"schema": "fedpriv.privacy.ledger", "version": 1, "accountant": "rdp"}', "corrupt")],
)
def test_corrupt_or_missing_file(tmp_path, content, match):
    path = tmp_path / "ledger.json"
    path.write_text(content)
    with pytest.raises(LedgerError, match=match):
        PrivacyLedger.load(path)
    with pytest.raises(LedgerError, match="cannot read"):
        PrivacyLedger.load(tmp_path / "missing.json")
