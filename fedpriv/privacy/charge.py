"""A charge: what one release costs, under the ledger entry that books it.

It is made once, from the training plan (or a release's parsed request), and that one value
travels: the node books it in its durable ledger, sends it in its reply, and the server
compares it with the charge it booked when it sent the instruction. Where two descriptions
of one cost must agree (the plan's and the DP-SGD engine's own), ``require_same`` raises,
an explicit error that ``python -O`` keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedpriv.privacy.events import DpEvent


class ChargeMismatchError(ValueError):
    """Two descriptions of one release's cost differ: nothing is booked or sent on it."""


@dataclass(frozen=True)
class Charge:
    """``events`` booked under ``entry`` (one ledger entry is never charged twice)."""

    entry: str
    events: tuple[DpEvent, ...]

    def require_same(self, events: tuple[DpEvent, ...], what: str) -> None:
        """``ChargeMismatchError`` unless ``events`` (what ``what`` spends) are this charge's."""
        if tuple(events) != self.events:
            raise ChargeMismatchError(
                f"{self.entry}: {what} spends {list(events)}, not the charged {list(self.events)}")
