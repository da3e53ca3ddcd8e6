"""The server's ledger: durable in ``state-dir/ledger.json`` (shared by every run on that
state, locked against concurrent writers), or held in memory for one run without a state dir.

It is the server's *own* view: it books a round for a client when it sends the
instruction, so a lost reply still counts and it never shows less than the client's
node. The node's ledger, not this one, is what protects the node's data.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedpriv.privacy import AccountantKind, Budget, PrivacyLedger
from fedpriv.privacy.store import LedgerStore


class ServerLedger:
    """``transaction()`` to check and book; ``snapshot()`` to read."""

    def __init__(self, budget: Budget, path: Path | None = None,
                 accountant: AccountantKind | str = AccountantKind.RDP) -> None:
        self.budget = budget
        self.accountant = AccountantKind(accountant)
        self.path = path
        self._store = LedgerStore(path) if path is not None else None
        self._memory = PrivacyLedger(budget, self.accountant)
        if self._store is not None:
            with self.transaction():
                pass  # load what earlier runs booked

    @contextmanager
    def transaction(self) -> Iterator[PrivacyLedger]:
        """The ledger, changes kept only if the block completes (saved atomically when durable)."""
        if self._store is not None:
            with self._store.transaction(self.budget, self.accountant) as ledger:
                yield ledger
                self._memory = ledger
            return
        working = self._memory.copy()
        yield working
        self._memory = working

    def snapshot(self) -> PrivacyLedger:
        """The ledger as of this process's last transaction (do not change it)."""
        return self._memory
