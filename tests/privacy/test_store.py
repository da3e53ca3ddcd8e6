"""LedgerStore: concurrent processes lose nothing, budget checks are atomic, failed or
empty transactions leave the file alone, corrupt files are errors."""

import fcntl
import json
import math
import multiprocessing
import os
import time

import pytest

from fedpriv.privacy import Budget, LaplaceEvent, LedgerError, LedgerStore, PrivacyLedger
from tests.timeouts import scaled

UNLIMITED = Budget(math.inf, 1e-5)
CTX = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
PROCESSES, ENTRIES = 4, 25
REFUSED = 3  # exit status of a worker whose entry did not fit


def _record_many(path, worker, barrier):
    store = LedgerStore(path)
    barrier.wait()
    for j in range(ENTRIES):
        with store.transaction(UNLIMITED, "basic") as ledger:
            ledger.record("c", f"p{worker}/e{j}", LaplaceEvent(100.0))


def _record_if_affordable(path, worker, barrier):
    store = LedgerStore(path)
    barrier.wait()
    with store.transaction(Budget(1.5, 1e-5), "basic") as ledger:
        if not ledger.can_afford("c", LaplaceEvent(1.0)):  # ε = 1 each: only one fits
            raise SystemExit(REFUSED)
        time.sleep(0.3)  # a wide window between check and record
        ledger.record("c", f"p{worker}", LaplaceEvent(1.0))


def _run(target, path, n):
    barrier = CTX.Barrier(n)
    procs = [CTX.Process(target=target, args=(str(path), i, barrier)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=scaled(60))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def _lock_is_free(store):
    fd = os.open(store.lock_path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_concurrent_processes_lose_no_entry(tmp_path):
    path = tmp_path / "ledger.json"
    assert _run(_record_many, path, PROCESSES) == [0] * PROCESSES
    ledger = LedgerStore(path).read()
    keys = list(ledger.entries("c"))
    assert sorted(keys) == sorted(f"p{i}/e{j}" for i in range(PROCESSES) for j in range(ENTRIES))
    for i in range(PROCESSES):  # each process's entries in the order it recorded them
        assert [k for k in keys if k.startswith(f"p{i}/")] == [f"p{i}/e{j}" for j in range(ENTRIES)]
    assert ledger.events("c") == (LaplaceEvent(100.0),) * (PROCESSES * ENTRIES)
    assert sorted(os.listdir(tmp_path)) == ["ledger.json", "ledger.json.lock"]  # no temp files left


def test_budget_check_and_record_are_atomic(tmp_path):
    path = tmp_path / "ledger.json"
    assert sorted(_run(_record_if_affordable, path, 2)) == [0, REFUSED]
    ledger = LedgerStore(path).read()
    assert len(ledger.entries("c")) == 1 and ledger.spent("c") == 1.0


def test_transaction_loads_records_and_saves(tmp_path):
    store = LedgerStore(tmp_path / "new" / "folder" / "ledger.json")  # folders made as needed
    assert not store.exists()
    with store.transaction(Budget(4.0, 1e-5), "basic") as ledger:
        assert ledger.clients() == [] and ledger.budget == Budget(4.0, 1e-5)
        ledger.record("c", "run-1/round-1/train", LaplaceEvent(1.0))
    assert store.exists()
    with store.transaction(Budget(4.0, 1e-5), "basic") as ledger:
        assert ledger.spent("c") == 1.0
        assert ledger.record("c", "run-1/round-1/train", LaplaceEvent(1.0)) is False
        ledger.record("c", "run-2/round-1/train", LaplaceEvent(0.5))
    assert list(store.read().entries("c")) == ["run-1/round-1/train", "run-2/round-1/train"]
    assert PrivacyLedger.load(store.path) == store.read()


def test_callers_budget_and_accountant_win_client_budgets_kept(tmp_path):
    path = tmp_path / "ledger.json"
    old = PrivacyLedger(Budget(8.0, 1e-6), "zcdp", client_budgets={"vip": Budget(20.0, 1e-5)})
    old.record("c", "a", LaplaceEvent(1.0))
    old.save(path)
    store = LedgerStore(path)
    with store.transaction(Budget(1.5, 1e-5), "basic") as ledger:
        assert ledger.budget == Budget(1.5, 1e-5) and ledger.accountant.value == "basic"
        assert ledger.budget_for("vip") == Budget(20.0, 1e-5)
        assert not ledger.can_afford("c", LaplaceEvent(1.0))  # 2 > 1.5, though the file says 8
        ledger.record("c", "b", LaplaceEvent(2.0))
    assert store.read().budget == Budget(1.5, 1e-5)
    assert store.read().client_budgets == {"vip": Budget(20.0, 1e-5)}
    assert store.read(Budget(3.0, 1e-3)).budget == Budget(3.0, 1e-3)


def test_failed_transaction_writes_nothing_and_releases_the_lock(tmp_path):
    store = LedgerStore(tmp_path / "ledger.json")
    with store.transaction(UNLIMITED) as ledger:
        ledger.record("c", "a", LaplaceEvent(10.0))
    before = store.path.read_bytes()
    with pytest.raises(KeyError, match="boom"):
        with store.transaction(UNLIMITED) as ledger:
            ledger.record("c", "b", LaplaceEvent(10.0))
            ledger.record("d", "a", LaplaceEvent(10.0))
            raise KeyError("boom")
    assert store.path.read_bytes() == before
    assert _lock_is_free(store)
    with store.transaction(UNLIMITED) as ledger:  # and the next one opens
        assert list(ledger.entries("c")) == ["a"] and ledger.clients() == ["c"]


def test_transaction_that_changes_nothing_does_not_rewrite(tmp_path):
    store = LedgerStore(tmp_path / "ledger.json")
    with store.transaction(UNLIMITED, "basic") as ledger:
        assert ledger.can_afford("c", LaplaceEvent(10.0))
    assert not store.exists()  # nothing recorded: no file made
    with store.transaction(UNLIMITED, "basic") as ledger:
        ledger.record("c", "a", LaplaceEvent(10.0))
    stat, content = store.path.stat(), store.path.read_bytes()
    time.sleep(0.01)
    with store.transaction(UNLIMITED, "basic") as ledger:
        assert ledger.spent("c") == 0.1 and ledger.has_entry("c", "a")
        assert ledger.record("c", "a", LaplaceEvent(10.0)) is False  # a retry
    after = store.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert store.path.read_bytes() == content
    with store.transaction(UNLIMITED, "basic") as ledger:  # a real change does replace it
        ledger.record("c", "b", LaplaceEvent(10.0))
    assert store.path.stat().st_ino != stat.st_ino


@pytest.mark.parametrize("content", [b"", b"{oops", b'{"schema": "other"}', b"\xff\xfe{}",
                                     b'{"schema": "fedpriv.privacy.ledger", "version": 2}'])
def test_corrupt_file_is_an_error_never_an_empty_ledger(tmp_path, content):
    store = LedgerStore(tmp_path / "ledger.json")
    store.path.write_bytes(content)
    with pytest.raises(LedgerError):
        with store.transaction(UNLIMITED) as ledger:
            ledger.record("c", "a", LaplaceEvent(10.0))
    with pytest.raises(LedgerError):
        store.read()
    with pytest.raises(LedgerError):
        store.read(UNLIMITED)
    assert store.path.read_bytes() == content
    assert _lock_is_free(store)


def test_read_without_a_file(tmp_path):
    store = LedgerStore(tmp_path / "missing" / "ledger.json")
    with pytest.raises(LedgerError, match="no ledger file"):
        store.read()
    empty = store.read(Budget(2.0, 1e-5), "zcdp")
    assert empty.clients() == [] and empty.budget == Budget(2.0, 1e-5) and empty.accountant.value == "zcdp"
    assert not (tmp_path / "missing").exists()


def test_read_is_a_snapshot(tmp_path):
    store = LedgerStore(tmp_path / "ledger.json")
    with store.transaction(UNLIMITED) as ledger:
        ledger.record("c", "a", LaplaceEvent(10.0))
    snapshot = store.read()
    snapshot.record("c", "b", LaplaceEvent(10.0))
    assert list(store.read().entries("c")) == ["a"]


def test_version_1_file_is_migrated_on_write(tmp_path):
    store = LedgerStore(tmp_path / "ledger.json")
    store.path.write_text(json.dumps({
        "schema": "fedpriv.privacy.ledger", "version": 1, "accountant": "basic",
        "budget": {"epsilon": 5.0, "delta": 1e-5}, "client_budgets": {},
        "clients": {"0": [{"round": 1, "events": [{"type": "laplace", "noise_multiplier": 1.0}]}]},
    }))
    with store.transaction(Budget(5.0, 1e-5), "basic") as ledger:
        assert ledger.spent("0") == 1.0
        ledger.record("0", "run-x/round-2/train", LaplaceEvent(1.0))
    data = json.loads(store.path.read_text())
    assert data["version"] == 2
    assert [e["entry"] for e in data["clients"]["0"]] == ["1", "run-x/round-2/train"]


def test_nested_transaction_on_one_file_raises_instead_of_deadlocking(tmp_path):
    path = tmp_path / "ledger.json"
    with LedgerStore(path).transaction(UNLIMITED):
        with pytest.raises(RuntimeError, match="already open"):
            with LedgerStore(path).transaction(UNLIMITED):
                pass
        with pytest.raises(RuntimeError, match="already open"):
            LedgerStore(path).read(UNLIMITED)
    assert _lock_is_free(LedgerStore(path))
