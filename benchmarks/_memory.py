"""Peak memory of this process and of the processes it started (Ray's), sampled from /proc.

Memory is the proportional set size (PSS): a page shared by k processes (torch's libraries
in every Ray worker, Ray's object store) counts 1/k in each, so the sum over processes is
what they hold together. Linux only; elsewhere every reading is 0.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

from simulations._processes import descendants

MIB = 2**20


def pss_bytes(pid: int) -> int:
    """``pid``'s proportional set size; 0 where the process is gone or unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class PeakMemory:
    """Within the block, every ``interval`` s: this process's PSS and that of all its
    descendants; keeps the peaks (MiB) of this process, of the others, and of their sum."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.peak_mb = {"driver": 0.0, "ray": 0.0, "total": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peak-memory", daemon=True)

    def sample(self) -> None:
        """Take one reading now."""
        driver = pss_bytes(os.getpid()) / MIB
        others = sum(pss_bytes(pid) for pid in descendants(os.getpid())) / MIB
        for key, value in (("driver", driver), ("ray", others), ("total", driver + others)):
            self.peak_mb[key] = max(self.peak_mb[key], value)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PeakMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
