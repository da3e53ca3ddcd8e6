"""Flower's deployment processes (SuperLink, SuperNodes, the ``flwr`` CLI) on this machine.

Shared by ``simulations.deployment`` and the tests that deploy for real. Every process is
started in its own process group and recorded in a ``Processes``, whose exit stops each
group by PID (SIGTERM, then SIGKILL): the SuperLink's and SuperNodes' own children
(SuperExec, ServerApp, ClientApps) go with them, on success, error or Ctrl-C. Each one's
output goes to its log file without Flower's colour codes, and, where asked, to the
terminal too (notices kept to the file, as ``simulations._logging`` keeps them).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, TextIO

import httpx

from fedpriv.certificates import TlsFiles
from fedpriv.federation.policy import POLICY_ENV
from simulations._logging import ANSI, is_notice, terminal_text

BIN = Path(sys.executable).parent
"""The venv's scripts: flower-superlink, flower-supernode, flwr, ray."""


class ProcessError(RuntimeError):
    """A process did not start, or ended with an error; the message says which and where its log is."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def base_env(flwr_home: Path | None = None) -> dict[str, str]:
    """This environment minus any node policy, with the venv's scripts first on PATH (Flower
    starts flower-superexec and flwr-clientapp by name), and FLWR_HOME when given."""
    env = {k: v for k, v in os.environ.items() if k != POLICY_ENV}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if flwr_home is not None:
        env["FLWR_HOME"] = str(flwr_home)
    return env


def write_flwr_config(flwr_home: Path, name: str, address: str, tls: TlsFiles | None) -> None:
    """The ``flwr`` CLI's connection ``name`` to the SuperLink at ``address``."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    trust = f'root-certificates = "{tls.ca_cert}"' if tls else "insecure = true"
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n{trust}\n')


def healthy(address: str, tls: TlsFiles | None) -> bool:
    """Whether the SuperLink at ``address`` answers its health check."""
    try:
        if tls:
            return httpx.get(f"https://{address}/health", timeout=1, verify=str(tls.ca_cert)).is_success
        return httpx.get(f"http://{address}/health", timeout=1).is_success
    except httpx.HTTPError:
        return False


def superlink_command(port: int, database: Path, tls: TlsFiles | None, *, simulation: bool = False,
                      supernode_auth: bool = False, host: str = "127.0.0.1") -> list[str]:
    security = (["--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key)]
                if tls else ["--insecure"])
    return [str(BIN / "flower-superlink"), *security, *(["--enable-supernode-auth"] if supernode_auth else []),
            *(["--simulation"] if simulation else []), "--isolation", "subprocess", "--host", host,
            "--port", str(port), "--database", str(database), "--disable-runtime-dependency-installation"]


def supernode_command(superlink: str, node_config: str, ca_cert: Path | None, key: Path | None = None,
                      max_retries: int | None = None) -> list[str]:
    """A SuperNode that trusts ``ca_cert`` (plaintext without one), authenticating with ``key``."""
    security = ["--root-certificates", str(ca_cert)] if ca_cert else ["--insecure"]
    return [str(BIN / "flower-supernode"), *security, "--superlink", superlink,
            *(["--auth-supernode-private-key", str(key)] if key else []),
            *(["--max-retries", str(max_retries)] if max_retries is not None else []),
            "--port", str(free_port()), "--node-config", node_config]


@dataclass
class Started:
    """One process this program started, where its output goes, and the thread copying it there."""

    name: str
    process: subprocess.Popen
    log: Path
    copier: threading.Thread | None = None

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


OUTPUT_DRAIN_S = 5.0
"""How long ``Processes.wait`` waits, after an exit, for the copier to reach the end of its output."""


def copy_output(stream: IO[bytes], log: Path, echo: TextIO | None) -> None:
    """Each line of ``stream`` to ``log`` (appended, without colour codes) as it comes, and
    to ``echo`` too, but notices (colours kept only where ``echo`` is a terminal)."""
    colours = bool(echo is not None and echo.isatty())
    with log.open("a", encoding="utf-8") as file:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            file.write(ANSI.sub("", line))
            file.flush()
            if echo is not None and not is_notice(line):
                echo.write(terminal_text(line, colours))
                echo.flush()


class Processes:
    """The processes one deployment started; ``stop_all`` (also on exit) stops each group,
    and every descendant seen while waiting on them (Flower detaches SuperExec, whose
    children outlive a SuperLink killed from outside)."""

    def __init__(self) -> None:
        self.started: list[Started] = []
        self.seen: dict[int, str] = {}  # pid -> its start time, so a reused pid is left alone

    def start(self, name: str, command: Sequence[str], env: Mapping[str, str], log: Path,
              cwd: Path | None = None, echo: TextIO | None = None) -> Started:
        """Start ``command``, its output copied to ``log`` (and ``echo``: ``copy_output``)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(list(command), env=dict(env), cwd=cwd, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        assert process.stdout is not None  # a pipe was asked for
        copier = threading.Thread(target=copy_output, args=(process.stdout, log, echo), name=f"{name} output",
                                  daemon=True)
        copier.start()
        started = Started(name, process, log, copier)
        self.started.append(started)
        return started

    def track(self) -> None:
        """Remember every live descendant of the processes started."""
        for started in self.started:
            for pid in descendants(started.process.pid):
                if (start := start_time(pid)) is not None:
                    self.seen.setdefault(pid, start)

    def wait(self, started: Started, timeout: float | None = None) -> int:
        """``started``'s exit code once its output is in its log, tracking descendants meanwhile;
        ``TimeoutExpired`` past ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := started.process.poll()) is None:
            self.track()
            if timeout is not None and deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(started.process.args, timeout)
            time.sleep(0.5)
        if started.copier is not None:  # a child that outlives it may hold the pipe: not forever
            started.copier.join(OUTPUT_DRAIN_S)
        return code

    def wait_until(self, ready: Callable[[], bool], started: Started, timeout: float, what: str) -> None:
        """Poll ``ready()`` until true; ``ProcessError`` if ``started`` exits or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            is_ready = ready()
            self.track()  # also once ready: the children it became ready with are kept
            if is_ready:
                return
            if started.process.poll() is not None:
                raise ProcessError(f"{started.name} exited with code {started.process.returncode} before {what}; "
                                   f"log {started.log}:\n{started.tail()}")
            if time.monotonic() > deadline:
                raise ProcessError(f"{started.name} did not {what} within {timeout:.0f} s; log {started.log}")
            time.sleep(0.2)

    def stop(self, started: Started, timeout: float = 20) -> None:
        """SIGTERM to the process group, SIGKILL after ``timeout`` s."""
        stop_group(started.process, timeout)

    def stop_all(self) -> None:
        self.track()
        for started in reversed(self.started):
            self.stop(started)
        stop_pids(self.seen)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid`` (from /proc; empty where there is none)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def stop_pids(seen: Mapping[int, str], timeout: float = 10) -> None:
    """Stop each ``pid`` of ``seen`` still running since its recorded start time (a reused
    pid is left alone): SIGTERM, then SIGKILL after ``timeout`` s."""
    pids = [pid for pid, start in seen.items() if start_time(pid) == start]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not any(_alive(pid) for pid in pids):
            return


def stop_group(process: subprocess.Popen, timeout: float = 20) -> None:
    """Stop ``process``, its process group, and its descendants in other sessions (Flower
    starts SuperExec detached): SIGTERM, then SIGKILL after ``timeout`` s."""
    others = descendants(process.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for kill, target in ((os.killpg, process.pid), *((os.kill, pid) for pid in others)):
            try:
                kill(target, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + timeout
        try:
            process.wait(timeout=timeout)
            while any(_alive(pid) for pid in others) and time.monotonic() < deadline:
                time.sleep(0.1)
        except subprocess.TimeoutExpired:
            continue
        if not any(_alive(pid) for pid in others):
            break
    try:  # the leader is gone; its group may not be
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot), or ``None`` if it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into ``KeyboardInterrupt`` meanwhile, so ``finally`` blocks stop what was started."""
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
