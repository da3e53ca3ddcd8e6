"""LedgerStore: a privacy ledger that lives in a file and is shared by processes.

Why:
- A node's ledger must outlive runs and restarts. Privacy spent in one run is spent for
  good, so the next run (or the same run after a crash) has to start from everything
  recorded before, not from an empty ledger.
- Two runs or processes may record at once (two federations training on one node, a
  client app and a release of its data size). A plain load-modify-save would let one of
  them overwrite the other's entries: spent privacy silently forgotten. Every change
  therefore happens in a ``transaction``: an exclusive lock (``fcntl.flock`` on a lock
  file beside the ledger, ``path + ".lock"``), the ledger read *under* that lock, the
  budget check and the record made on what is really there, and the file replaced before
  the lock is released. A budget check and its record are thus one atomic step: of two
  processes that each want the last bit of a budget, exactly one gets it.
- A crash leaves the old file or the new one: the file is replaced atomically (temp file,
  fsync, ``os.replace``, then an fsync of the folder so the rename itself is durable).
  The lock lives in a separate file because ``os.replace`` swaps the ledger's inode.
  A process killed mid-write leaves its temp file behind; temp files are named
  ``.<name>.locked-*.tmp`` and made only under the exclusive lock, so the next transaction,
  holding that lock, knows their writers are gone and removes them (never a file another
  live writer is still filling: it would hold the lock).
- Speed: a store object keeps the bytes it last read or wrote and the ledger they parse
  to; a transaction that reads the same bytes under its lock works on a copy of that
  ledger instead of parsing the file again (another writer's bytes differ, and are parsed).
  The copy equals (``==``) the parse; only a number recorded as an int keeps its spelling
  ("1", where a parse reads 1.0) in this process's later saves.
- A corrupt or unreadable file raises ``LedgerError``; the store never silently starts
  an empty ledger over one (that would reset every client's spent ε to 0). Its text names
  the file but not its folder (a node's refusal reaches the server, and a node's paths are
  none of the server's business); the full path is logged locally.

Usage::

    store = LedgerStore("state/ledger.json")
    with store.transaction(Budget(2.0, 1e-5), accountant="rdp") as ledger:
        if ledger.can_afford(client, events, budget=run_budget):
            ledger.record(client, entry, events, budget=run_budget)
    # normal exit: saved iff the block changed the ledger; an exception: nothing written
    snapshot = store.read()      # under a shared lock; the file's own budget

``flock`` locks are advisory and per open file: they exclude other processes and other
``LedgerStore`` objects (and threads) alike, but a transaction must not be nested inside
another one on the same file in the same thread (that would wait for itself forever; it
raises ``RuntimeError`` instead). Locks need a file system that supports ``flock`` across
the processes concerned (local disks do; some network file systems do not).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from fedpriv.files import write_bytes_atomic
from fedpriv.privacy.accountants import AccountantKind
from fedpriv.privacy.budget import Budget
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.privacy.ledger_json import LedgerError

log = logging.getLogger(__name__)
_held = threading.local()  # lock files this thread holds a transaction on


class _NoLockFile(Exception):
    """The lock file neither exists nor can be made (a read-only folder)."""


class LedgerStore:
    """A ``PrivacyLedger`` in the file ``path``, locked through ``path + ".lock"``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        # The file's bytes as this object last read or wrote them, and the ledger they
        # parse to (never handed out, only copies): a transaction that finds the same bytes
        # under its lock copies the ledger instead of parsing the file again.
        self._cache: tuple[bytes, PrivacyLedger] | None = None

    def exists(self) -> bool:
        """Is there a ledger file (readable or not)?"""
        return self.path.exists()

    @contextlib.contextmanager
    def transaction(
        self, budget: Budget, accountant: AccountantKind | str = AccountantKind.RDP
    ) -> Iterator[PrivacyLedger]:
        """The ledger, read under an exclusive lock (waiting until it is free): the one in
        the file, or a new empty one if there is no file. Its ``budget`` and
        ``accountant`` are set to the ones given (the caller's policy is the truth; the
        budget stored in the file is informational); per-client budgets in the file are
        kept. On normal exit the ledger is saved atomically if the block changed it; if
        the block raises, nothing is written and the exception propagates. The lock is
        released either way."""
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, got {budget!r}")
        kind = AccountantKind(accountant)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked(fcntl.LOCK_EX):
            self._remove_dead_writers_files()
            ledger = self._load()
            if ledger is None:
                ledger = PrivacyLedger(budget, kind)
            ledger.budget = budget
            ledger.accountant = kind
            before = ledger.to_json()
            yield ledger
            after = ledger.to_json()
            if after != before:
                data = after.encode("utf-8")
                write_bytes_atomic(self.path, data, temp_prefix=self._temp_prefix)
                _fsync_folder(self.path.parent)
                self._cache = (data, ledger.copy())

    def read(
        self, budget: Budget | None = None, accountant: AccountantKind | str | None = None
    ) -> PrivacyLedger:
        """A snapshot of the ledger, read under a shared lock. With ``budget`` (or
        ``accountant``) None, the one stored in the file; if there is no file, an empty
        ledger with the given budget (and accountant, default RDP), or ``LedgerError`` when
        no budget is given. Changing the snapshot does not change the file."""
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, got {budget!r}")
        kind = None if accountant is None else AccountantKind(accountant)
        if self.path.parent.is_dir():
            try:
                with self._locked(fcntl.LOCK_SH):
                    ledger = self._load()
            except _NoLockFile:
                # A read-only folder without a lock file: writers replace the ledger file
                # atomically, so reading it unlocked still sees a whole ledger.
                ledger = self._load()
        else:
            ledger = None
        if ledger is None:
            if budget is None:
                raise self._error(f"no ledger file {self.path.name!r} (and no budget given for an empty one)")
            return PrivacyLedger(budget, kind or AccountantKind.RDP)
        if budget is not None:
            ledger.budget = budget
        if kind is not None:
            ledger.accountant = kind
        return ledger

    # --- internals ------------------------------------------------------------------
    @property
    def _temp_prefix(self) -> str:
        """The prefix of the temp files a transaction writes, and only a transaction."""
        return f".{self.path.name}.locked-"

    def _remove_dead_writers_files(self) -> None:
        """Remove the temp files of transactions killed mid-write; call only under the
        exclusive lock (every writer of such a file held it, so none is alive)."""
        try:
            names = os.listdir(self.path.parent)
        except OSError:
            return
        for name in names:
            if name.startswith(self._temp_prefix) and name.endswith(".tmp"):
                log.warning("removing %s, left by a process killed while writing its ledger", self.path.parent / name)
                try:
                    (self.path.parent / name).unlink(missing_ok=True)
                except OSError as err:  # a leftover that cannot go costs disk, not privacy
                    log.warning("cannot remove %s: %s", self.path.parent / name, err)

    def _load(self) -> PrivacyLedger | None:
        """The ledger in the file (a copy of the cached one if the bytes are the cache's),
        None if there is none; ``LedgerError`` if unreadable."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise self._error(f"cannot read ledger file {self.path.name!r}: "
                              f"{err.strerror or type(err).__name__}") from err
        cache = self._cache
        if cache is not None and cache[0] == data:
            return cache[1].copy()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise self._error(f"corrupt ledger file {self.path.name!r}: not UTF-8 ({err.reason})") from err
        try:
            ledger = PrivacyLedger.from_json(text, self.path.name)
        except LedgerError as err:
            raise self._error(str(err)) from err
        self._cache = (data, ledger.copy())
        return ledger

    def _error(self, message: str) -> LedgerError:
        """``message`` (naming no folder) as a ``LedgerError``; logged here with the full path."""
        log.error("%s: %s", self.path, message)
        return LedgerError(message)

    @contextlib.contextmanager
    def _locked(self, operation: int) -> Iterator[None]:
        """Hold ``flock(operation)`` on the lock file (made if missing) for the block."""
        key = os.path.realpath(self.lock_path)
        held: set[str] = _held.__dict__.setdefault("paths", set())
        if key in held:
            raise RuntimeError(f"a ledger transaction on {str(self.path)!r} is already open in this thread")
        cloexec = getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | cloexec, 0o666)
        except PermissionError:
            if operation != fcntl.LOCK_SH:
                raise
            try:  # a shared lock needs only read access to an existing lock file
                fd = os.open(self.lock_path, os.O_RDONLY | cloexec)
            except (FileNotFoundError, PermissionError) as err:
                raise _NoLockFile from err
        try:
            fcntl.flock(fd, operation)  # blocks until free
            held.add(key)
            try:
                yield
            finally:
                held.discard(key)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
