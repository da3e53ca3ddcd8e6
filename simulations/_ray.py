"""Ray for the simulations, with bounds: starting (or joining) a cluster fails with one line
instead of hanging, and a watchdog ends the run when the cluster stops answering.

Flower starts Ray inside its simulation engine and, when that fails, goes on waiting for
nodes that never come; so the simulations start Ray first (Flower then uses the running
one). Ray's ``runtime_env`` carries ``PYTHONPATH`` (as Flower's would) and the simulated
nodes' policy file to every worker, also on the other machines of a cluster.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from fedpriv.environment import number_from_env
from fedpriv.project import PROJECT_ROOT

START_TIMEOUT_ENV = "FEDPRIV_RAY_START_TIMEOUT"
"""Seconds Ray may take to start or join (default 120)."""

WORKER_NICENESS_ENV = "RAY_worker_niceness"
"""Ray starts its workers (the simulated nodes' actors) at nice 15 unless this says otherwise:
on a machine busy with anything at nice 0 they then get a few percent of a core (the
quick start's 3 nodes took 49 s to describe themselves at load 6-13). A cluster this
program starts runs them at 0, like the ServerApp (a value already set is kept)."""
NODE_WAIT_ENV = "RAY_raylet_start_wait_time_s"
"""How long Ray waits for the node it starts to register with its GCS (its default 30 s; the
30 s written in ``ray._private.node`` counts only once this wait has given up). A cluster this
program starts gets fedpriv's start window (``start_timeout()``, whole seconds); a value
already set is kept (the tests scale it with theirs: tests/timeouts.py)."""
STARTUP_TIMED_OUT = "The current node timed out during startup"
"""Ray's error when its node took longer than that to register (a busy machine): the start
is retried once."""

WATCH_INTERVAL_S = 5.0
WATCH_MISSES = 3
"""The cluster is dead after this many unanswered checks, WATCH_INTERVAL_S apart."""


def start_timeout() -> float:
    try:
        return number_from_env(START_TIMEOUT_ENV, 120.0, lambda seconds: seconds > 0, "a number of seconds > 0")
    except ValueError as err:
        fail(str(err))


def _kill(pids: set[int]) -> None:
    """SIGKILL to each of ``pids`` (gone ones skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def answers(address: str, timeout: float = 5.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def fail(message: str) -> NoReturn:
    """One line on stderr, stop the Ray processes this program started, exit 1 at once (a
    hung Ray call cannot be cancelled, so no clean-up that waits on Ray)."""
    from simulations._processes import descendants

    print(f"{_prog()}: error: {message}", file=sys.stderr, flush=True)
    _kill(set(descendants(os.getpid())))
    os._exit(1)


def _prog() -> str:
    """``python -m simulations.mnist`` for this program, as its usage line names it."""
    path = Path(sys.argv[0]).resolve()
    try:
        return "python -m " + ".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts)
    except ValueError:
        return path.name or "python"


@contextmanager
def ray_cluster(init_args: Mapping[str, Any], env_vars: Mapping[str, str]) -> Iterator[str]:
    """Start Ray (or join ``init_args["address"]``) within ``start_timeout()``; yields the
    cluster's GCS address and watches it until the block ends."""
    address = init_args.get("address")
    if address and not answers(address):
        fail(f"no Ray cluster answers at {address} (start one with `ray start --head`)")
    timeout, windows = start_timeout(), 0
    os.environ.setdefault(WORKER_NICENESS_ENV, "0")  # read by the raylet ray.init starts
    os.environ.setdefault(NODE_WAIT_ENV, str(math.ceil(timeout)))  # read by Ray's core here when imported
    import ray

    pythonpath = os.pathsep.join([*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    outcome: dict[str, BaseException] = {}
    started, done = threading.Event(), threading.Event()
    attempts = [1]  # a retry appends; the main thread gives it a window of its own

    def init() -> None:
        ray.init(**{"include_dashboard": False, **init_args},
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath, **env_vars}})

    def start() -> None:
        """Start Ray, then stay alive until the run ends: Ray's processes are bound to the
        thread that started them (they die with it). A start that timed out is retried once."""
        from simulations._processes import descendants

        before = set(descendants(os.getpid()))
        try:
            try:
                init()
            except Exception as err:
                if STARTUP_TIMED_OUT not in str(err):
                    raise
                ray.shutdown()
                _kill(set(descendants(os.getpid())) - before)  # the failed start's processes
                attempts.append(2)
                init()
        except BaseException as err:  # reported by the main thread
            outcome["error"] = err
        started.set()
        done.wait()

    # started off the main thread (to bound it), so Ray leaves SIGTERM alone and says so
    logging.getLogger("ray._private.worker").addFilter(
        lambda record: "SIGTERM handler is not set" not in record.getMessage())
    threading.Thread(target=start, name="ray-start", daemon=True).start()
    while not started.wait(timeout):
        windows += 1
        if windows >= len(attempts):
            fail(f"Ray did not start within {timeout:g} s (raise ${START_TIMEOUT_ENV} on a slow machine)")
    if "error" in outcome:
        first = (str(outcome["error"]).strip().splitlines() or [type(outcome["error"]).__name__])[0]
        fail(f"Ray failed to start: {first}")
    gcs = ray.get_runtime_context().gcs_address

    def watch() -> None:
        misses = 0
        while not done.wait(WATCH_INTERVAL_S):
            misses = 0 if answers(gcs) else misses + 1
            if misses >= WATCH_MISSES and not done.is_set():
                fail(f"the Ray cluster (GCS at {gcs}) stopped answering; the run is incomplete")

    threading.Thread(target=watch, name="ray-watchdog", daemon=True).start()
    try:
        yield gcs
    finally:
        done.set()
        ray.shutdown()
