"""The processes a test session started that are still running, and stopping them.

Every process the session starts carries ``FEDPRIV_TEST_PROCESSES=<session>/<test>`` in
its environment (tests/conftest.py sets it; children inherit it, Ray's workers and
Flower's SuperExec included, also once orphaned), so a leftover is found by its mark even
after its parent died. A forked child keeps its parent's first environment instead, so
this process's descendants count too. Python's own multiprocessing helpers, which end
with the interpreter, do not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from simulations._processes import descendants, start_time, stop_pids

MARK_ENV = "FEDPRIV_TEST_PROCESSES"
INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@dataclass(frozen=True)
class Leftover:
    """A live process: its start time (clock ticks since boot) and command line."""

    start: str
    command: str


def _environment_mark(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours
        return None
    prefix = f"{MARK_ENV}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def leftovers(mark: str, known: frozenset[int] = frozenset()) -> dict[int, Leftover]:
    """Live processes other than this one whose mark is ``mark`` or under it (``mark/...``),
    and this process's descendants not in ``known``."""
    me = os.getpid()
    since = int(start_time(me) or 0)
    candidates = set(descendants(me)) - known
    for stat in Path("/proc").glob("[0-9]*"):
        pid = int(stat.name)
        start = start_time(pid)
        if start is not None and int(start) >= since and pid not in candidates:
            value = _environment_mark(pid)
            if value is not None and (value == mark or value.startswith(f"{mark}/")):
                candidates.add(pid)
    found = {}
    for pid in candidates - {me}:
        start, command = start_time(pid), _command(pid)
        if start is not None and not any(helper in command for helper in INTERPRETER_HELPERS):
            found[pid] = Leftover(start, command)
    return found


def reap(found: dict[int, Leftover], timeout: float = 10) -> None:
    """Stop each of ``found`` still running (SIGTERM, SIGKILL after ``timeout`` s)."""
    stop_pids({pid: leftover.start for pid, leftover in found.items()}, timeout)


def describe(found: dict[int, Leftover]) -> str:
    return "; ".join(f"pid {pid}: {leftover.command[:160]}" for pid, leftover in sorted(found.items()))
