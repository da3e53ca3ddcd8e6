"""A node killed while writing its ledger (issue 37): the temp file it was filling stays
behind, and the next transaction, which holds the lock every such writer held, removes it;
a file another live writer is filling is never touched."""

import math
import os
import subprocess
import sys
import threading
from pathlib import Path

from fedpriv.privacy import Budget, LaplaceEvent, LedgerStore
from tests.timeouts import scaled, wait_for

UNLIMITED = Budget(math.inf, 1e-5)
STUCK_IN_REPLACE = """
import math, os, sys
from pathlib import Path
from fedpriv.privacy import Budget, LaplaceEvent, LedgerStore

def stuck(src, dst):  # the temp file is written and fsynced: die before it replaces the ledger
    Path(sys.argv[2]).touch()
    sys.stdin.read()

os.replace = stuck
with LedgerStore(sys.argv[1]).transaction(Budget(math.inf, 1e-5), "basic") as ledger:
    ledger.record("c", sys.argv[3], LaplaceEvent(100.0))
"""


def _leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith(".ledger.json.") and n.endswith(".tmp"))


def _writer_killed_mid_write(path: Path, entry: str) -> None:
    marker = path.parent / f"stuck-{entry}"
    child = subprocess.Popen([sys.executable, "-c", STUCK_IN_REPLACE, str(path), str(marker), entry],
                             stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        wait_for(marker.exists, child, "the writer's temp file", 60)
    finally:
        child.kill()
        child.wait(timeout=scaled(30))


def test_the_next_transaction_removes_the_files_of_writers_killed_mid_write(tmp_path):
    path = tmp_path / "ledger.json"
    with LedgerStore(path).transaction(UNLIMITED, "basic") as ledger:
        ledger.record("c", "before", LaplaceEvent(100.0))
    _writer_killed_mid_write(path, "killed-1")
    first = _leftovers(tmp_path)
    assert len(first) == 1  # what the kill left: the file exists, the ledger is the old one
    _writer_killed_mid_write(path, "killed-2")  # the next writer removed it, and left its own
    assert len(_leftovers(tmp_path)) == 1 and _leftovers(tmp_path) != first
    assert list(LedgerStore(path).read().entries("c")) == ["before"]
    with LedgerStore(path).transaction(UNLIMITED, "basic") as ledger:
        ledger.record("c", "after", LaplaceEvent(100.0))
    assert _leftovers(tmp_path) == []
    assert list(LedgerStore(path).read().entries("c")) == ["before", "after"]


def test_a_live_writers_file_is_left_alone(tmp_path):
    path = tmp_path / "ledger.json"
    unlocked = tmp_path / ".ledger.json.someone.tmp"  # a plain atomic write of the same name: not the store's
    unlocked.write_text("{}")
    marker = tmp_path / "stuck"
    child = subprocess.Popen([sys.executable, "-c", STUCK_IN_REPLACE, str(path), str(marker), "live"],
                             stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    def record() -> None:
        with LedgerStore(path).transaction(UNLIMITED, "basic") as ledger:
            ledger.record("c", "after", LaplaceEvent(100.0))

    waiting = threading.Thread(target=record)
    try:
        wait_for(marker.exists, child, "the live writer's temp file", 60)
        live = [n for n in _leftovers(tmp_path) if n != unlocked.name]
        assert len(live) == 1
        waiting.start()  # blocks on the lock the live writer holds: it must not remove its file
        waiting.join(timeout=0.5)
        assert [n for n in _leftovers(tmp_path) if n != unlocked.name] == live
    finally:
        child.kill()
        child.wait(timeout=scaled(30))
        if waiting.ident is not None:
            waiting.join(timeout=scaled(30))
    assert not waiting.is_alive()
    assert list(LedgerStore(path).read().entries("c")) == ["after"]
    assert _leftovers(tmp_path) == [unlocked.name]  # the dead writer's file went; the other stays
