"""Time limits in the tests: hang guards, never the measure of a pass.

A test waits for an event (a process's exit, a checkpoint, a ledger entry, a readiness
line); a limit only stops one that hangs, so each is generous, and each goes through
``scaled``: ``FEDPRIV_TEST_TIMEOUT_SCALE=3 python -m pytest`` triples them all on a slow
or crowded machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from fedpriv.environment import number_from_env

SCALE_ENV = "FEDPRIV_TEST_TIMEOUT_SCALE"


class Polled(Protocol):
    """A process that may end first (``subprocess.Popen``): ``poll()`` is its exit code or None."""

    returncode: int | None

    def poll(self) -> int | None: ...


def scale() -> float:
    """``$FEDPRIV_TEST_TIMEOUT_SCALE`` (default 1), a finite number > 0."""
    return number_from_env(SCALE_ENV, 1.0, lambda value: 0 < value < math.inf, "a number > 0")


def scaled(seconds: float) -> float:
    """``seconds`` times ``scale()``."""
    return seconds * scale()


RAY_START_WAITS = {"RAY_raylet_start_wait_time_s": 120, "RAY_worker_register_timeout_seconds": 240,
                   "RAY_py_gcs_connect_timeout_s": 120}
"""Ray's own start-up waits (its config, read from ``RAY_<name>`` by each of its processes),
in seconds before scaling: how long a driver waits for its node to register with the GCS
(Ray's default 30 s), a raylet for a worker it started to register (60 s), a process to
reach the GCS (30 s). Other clusters and CPU-bound jobs beside the tests slow all three.
One wait nothing raises: Ray 2.55's raylet gives its dashboard agent a fixed 15 s to start,
so a test must not slow the Python processes Ray starts (docs/federated.md, "A busy machine")."""


def ray_start_waits() -> dict[str, str]:
    """``RAY_START_WAITS`` scaled (whole seconds, as Ray reads them)."""
    return {name: str(math.ceil(scaled(seconds))) for name, seconds in RAY_START_WAITS.items()}


def wait_for(condition: Callable[[], bool], process: Polled, what: str, seconds: float) -> None:
    """Poll ``condition`` until true; fail if ``process`` ends first or after ``scaled(seconds)``."""
    limit = scaled(seconds)
    deadline = time.monotonic() + limit
    while not condition():
        assert process.poll() is None, f"exited ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {limit:g} s (${SCALE_ENV} raises it)"
        time.sleep(0.2)
