"""PrivacyLedger: merging, idempotency, budgets, atomic persistence, corrupt files."""

import json
import os

import pytest

from fedpriv.privacy import (
    Budget,
    BudgetExceededError,
    ComposedEvent,
    LaplaceEvent,
    LedgerError,
    PrivacyLedger,
    dpsgd_event,
    epsilon_of,
)
from fedpriv.privacy.ledger import merge_events


def test_rounds_merge_bit_for_bit():
    ledger = PrivacyLedger(Budget(10.0, 1e-5), "rdp")
    for r in range(1, 6):
        assert ledger.record("c1", r, [dpsgd_event(1.1, 0.01, 600)])
    assert merge_events(ledger.events("c1")) == dpsgd_event(1.1, 0.01, 3000)
    assert ledger.spent("c1") == epsilon_of(dpsgd_event(1.1, 0.01, 3000), 1e-5, "rdp")
    assert ledger.remaining("c1") == 10.0 - ledger.spent("c1")
    assert ledger.spent("unknown") == 0.0


def test_record_is_idempotent_per_round():
    ledger = PrivacyLedger(Budget(10.0, 1e-5), "zcdp")
    assert ledger.record("c1", 1, dpsgd_event(2.0, 0.01, 10))
    spent = ledger.spent("c1")
    assert ledger.record("c1", 1, dpsgd_event(2.0, 0.01, 10)) is False
    assert ledger.spent("c1") == spent
    with pytest.raises(LedgerError, match="different events"):
        ledger.record("c1", 1, dpsgd_event(3.0, 0.01, 10))
    assert ledger.spent("c1") == spent


def test_budget_exceeded_leaves_ledger_untouched():
    ledger = PrivacyLedger(Budget(3.0, 1e-5), "zcdp", client_budgets={"vip": Budget(100.0, 1e-5)})
    ledger.record("c1", 1, LaplaceEvent(2.0))
    before = ledger.to_dict()
    assert not ledger.can_afford("c1", [dpsgd_event(1.0, 0.1, 100)])
    with pytest.raises(BudgetExceededError, match=r"client 'c1'.*budget epsilon 3"):
        ledger.record("c1", 2, [dpsgd_event(1.0, 0.1, 100)])
    assert ledger.to_dict() == before
    assert ledger.can_afford("vip", [dpsgd_event(1.0, 0.1, 100)])
    assert ledger.record("vip", 1, [dpsgd_event(1.0, 0.1, 100)])


def test_heterogeneous_events_merge():
    merged = merge_events([ComposedEvent((LaplaceEvent(1.0), dpsgd_event(2.0, 0.1, 3))), dpsgd_event(2.0, 0.1, 4)])
    assert merged == ComposedEvent((dpsgd_event(1.0, 1.0, 1).__class__(LaplaceEvent(1.0), 1), dpsgd_event(2.0, 0.1, 7)))


def test_save_load_round_trip(tmp_path):
    ledger = PrivacyLedger(Budget(5.0, 1e-6), "pld", client_budgets={"b": Budget(1.0, 1e-5)})
    ledger.record("a", 1, dpsgd_event(1.5, 0.02, 50))
    ledger.record("b", 3, [LaplaceEvent(4.0), dpsgd_event(2.0, 0.05, 10)])
    path = tmp_path / "ledger.json"
    ledger.save(path)
    assert os.listdir(tmp_path) == ["ledger.json"]
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["accountant"] == "pld"
    loaded = PrivacyLedger.load(path)
    assert loaded == ledger
    assert loaded.spent("a") == ledger.spent("a")


def test_crash_mid_write_keeps_old_file(tmp_path, monkeypatch):
    ledger = PrivacyLedger(Budget(50.0, 1e-5), "zcdp")
    path = tmp_path / "ledger.json"
    ledger.save(path)
    old = path.read_text()
    ledger.record("a", 1, dpsgd_event(2.0, 0.01, 10))

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
     ('{"schema": "fedpriv.privacy.ledger", "version": 1, "accountant": "rdp"}', "corrupt")],
)
def test_corrupt_or_missing_file(tmp_path, content, match):
    path = tmp_path / "ledger.json"
    path.write_text(content)
    with pytest.raises(LedgerError, match=match):
        PrivacyLedger.load(path)
    with pytest.raises(LedgerError, match="cannot read"):
        PrivacyLedger.load(tmp_path / "missing.json")
