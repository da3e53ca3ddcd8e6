"""The console of the simulation commands: each log line once, no notices meant for developers,
no colour codes where nobody sees colours.

- Flower logs through its own console handler on the ``flwr`` logger. ``absl.logging``
  (used by dp-accounting, e.g. its "_compute_log_a_frac failed to converge" warning) calls
  ``logging.basicConfig()`` the first time it logs, which gives the root logger a handler:
  from then on every Flower record would also propagate there and print a second time
  (``INFO:flwr:...``, and Flower's DEBUG records too). So ``flwr`` does not propagate.
- ``ray.init`` warns on every start (``FutureWarning``, "Tip: In future versions of Ray,
  Ray will no longer override accelerator visible devices env var if num_gpus=0 ..."). Ray
  (2.55 here) hides the GPUs from an actor that asked for none, which is what
  ``--gpus-per-client 0`` means; the tip only announces that a future version will not.
  (Should the default change, ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`` keeps today's behaviour.)
- Flower colours its level names with ANSI codes; when stderr is not a terminal (a log
  file, a pipe) they are left out.
- Flower's FedAvg warns "fraction_evaluate is set to 0.0. Federated evaluation will be
  skipped": fedpriv's default, the server measuring test accuracy itself (a notice).

``console(log_path)`` goes further for a whole command: every Flower record also goes to
``log_path``, and the notices a user can do nothing about go *only* there (``NOTICES``:
Flower's deprecation and preview banners, about APIs this project calls, and its
"Manually terminating ClientAppActor", logged by every simulated node on a clean
shutdown; Ray's and Flower's deprecation warnings; Ray's advice on its log deduplication;
each simulated node's copy of the seeded-randomness warning, printed once by the command).
Lines the Ray actors print reach the terminal through ``sys.stdout``/``sys.stderr``, with
Ray's colour codes left out where those are not a terminal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

RAY_ACCELERATOR_TIP = "Tip: In future versions of Ray, Ray will no longer override accelerator visible devices"
FRACTION_EVALUATE_ZERO = "fraction_evaluate is set to 0.0"
"""Flower's FedAvg warns so when federated evaluation is off, fedpriv's default: the server
measures test accuracy itself every round, and no node spends budget on an evaluation."""
NOTICES = ("DEPRECATED FEATURE", "PREVIEW FEATURE", "FEATURE UPDATE", "Manually terminating ClientAppActor",
           RAY_ACCELERATOR_TIP, FRACTION_EVALUATE_ZERO)
"""A log record or printed line holding one of these goes to the log file only."""
ACTOR_LINE = re.compile(r"^\(\w+ pid=\d+(?:, ip=[^)]*)?\) ")
"""Ray's prefix of a line a worker printed: ``(ClientAppActor pid=10593) ``."""
RAY_DEDUP_ADVICE = re.compile(r" \(Ray deduplicates logs by default\..*?\)")
"""Appended by Ray to the first deduplicated line: a URL of its logging options."""
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
DEVELOPER_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
NOISY_PACKAGES = ("ray", "flwr")
"""Deprecation warnings raised inside these packages concern their APIs, not the user."""


def quiet_console() -> None:
    """Stop Flower's records reaching the root logger, filter Ray's accelerator tip, and
    drop Flower's colours when stderr is not a terminal."""
    from flwr.supercore.logger import update_console_handler

    logging.getLogger("flwr").propagate = False
    warnings.filterwarnings("ignore", message=re.escape(RAY_ACCELERATOR_TIP), category=FutureWarning)
    if not sys.stderr.isatty():
        update_console_handler(colored=False)


def is_notice(text: str) -> bool:
    """Whether ``text`` (a log message or a printed line) is a notice for the log file only: one
    of ``NOTICES``, or a simulated node's copy of the seeded-randomness warning, which the
    command (their operator) printed once for all of them."""
    from fedpriv.federation.seeded import SEEDED_RISK

    return any(notice in text for notice in NOTICES) or \
        (SEEDED_RISK in text and bool(ACTOR_LINE.match(ANSI.sub("", text))))


def terminal_text(line: str, colours: bool) -> str:
    """``line`` as the terminal gets it: without Ray's advice on deduplication, and without
    ANSI colour codes unless ``colours``."""
    line = RAY_DEDUP_ADVICE.sub("", line)
    return line if colours else ANSI.sub("", line)


class _LogFile:
    """The command's log file, opened on first use, shared by threads (Ray prints from its own)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(ANSI.sub("", text))
            self._file.flush()

    def close(self) -> None:
        with self.lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class _Diverting:
    """A text stream that passes whole lines to ``stream`` (colour codes dropped where it is
    not a terminal) and sends notices to the log file instead."""

    def __init__(self, stream: TextIO, log: _LogFile) -> None:
        self.stream = stream
        self.log = log
        self.colours = _isatty(stream)
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            if "\n" in self._pending:
                lines, _, self._pending = self._pending.rpartition("\n")
                for line in lines.split("\n"):
                    self._line(line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self._line(self._pending, end="")
                self._pending = ""
        self.stream.flush()

    def _line(self, line: str, end: str = "\n") -> None:
        if is_notice(line) or RAY_DEDUP_ADVICE.search(line):
            self.log.write(line + "\n")
        if not is_notice(line):
            self.stream.write(terminal_text(line, self.colours) + end)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _NoNotices(logging.Filter):
    """Keeps notices off a console handler (the log file's handler has them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not is_notice(record.getMessage())


@contextlib.contextmanager
def console(log_path: Path) -> Iterator[Path]:
    """While the block runs: ``quiet_console``, every Flower record also in ``log_path``
    (appended), notices only there, and ``sys.stdout``/``sys.stderr`` diverting them too;
    all undone at the end. Yields ``log_path``."""
    quiet_console()
    log = _LogFile(log_path)
    flwr = logging.getLogger("flwr")
    to_file = logging.StreamHandler(log)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    to_file.setLevel(logging.INFO)
    saved_streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Diverting(sys.stdout, log), _Diverting(sys.stderr, log)
    # Flower's console handlers write through the same streams (so a progress bar that moves
    # the standard streams' lines above it moves theirs too), notices filtered by record
    consoles = {h: h.stream for h in flwr.handlers if type(h) is not logging.FileHandler
                and isinstance(h, logging.StreamHandler) and h.stream in saved_streams}
    no_notices = _NoNotices()
    for handler, stream in consoles.items():
        handler.addFilter(no_notices)
        handler.setStream(sys.stdout if stream is saved_streams[0] else sys.stderr)
    flwr.addHandler(to_file)
    saved_showwarning = warnings.showwarning
    saved_filters = warnings.filters[:]
    warnings.filterwarnings("default", message=re.escape(RAY_ACCELERATOR_TIP), category=FutureWarning)

    def showwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    file: TextIO | None = None, line: str | None = None) -> None:
        if issubclass(category, DEVELOPER_WARNINGS) and _in_package(filename, NOISY_PACKAGES):
            log.write(warnings.formatwarning(message, category, filename, lineno, line))
        else:
            saved_showwarning(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    try:
        yield log_path
    finally:
        warnings.showwarning = saved_showwarning
        warnings.filters[:] = saved_filters  # type: ignore[index]  # typeshed: a Sequence; it is a list
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, _Diverting):
                stream.flush()
        sys.stdout, sys.stderr = saved_streams
        flwr.removeHandler(to_file)
        for handler, stream in consoles.items():
            handler.removeFilter(no_notices)
            handler.setStream(stream)
        log.close()


def _in_package(filename: str, packages: tuple[str, ...]) -> bool:
    """Whether ``filename`` is a module of one of the installed ``packages``."""
    parts = Path(filename).parts
    return any(part in packages and "site-packages" in parts[:i] for i, part in enumerate(parts))


@contextlib.contextmanager
def command_log(prog: str, out: Path | None) -> Iterator[Path]:
    """Where a command that writes one ``--out`` file logs while the block runs: beside it
    (``r.json`` → ``r.log``, kept), else ``fedpriv-<module>-<pid>.log`` in the temporary
    folder, removed when the block ends (it holds only the notices kept off the terminal)."""
    if out is not None:
        yield out.with_suffix(".log")
        return
    path = Path(tempfile.gettempdir()) / f"fedpriv-{prog.split()[-1]}-{os.getpid()}.log"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
