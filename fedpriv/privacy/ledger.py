"""PrivacyLedger: per-client privacy events with round tags, budgets and JSON persistence.

Invariants:
- A client's spent ε is the ε, at its budget's δ, of *all* its recorded events merged
  (``merge_events``) and composed by one fresh accountant of the ledger's kind.
- ``record`` never leaves a client past its budget: it raises ``BudgetExceededError``
  and changes nothing instead. Recording is idempotent per (client, round).
- ``save`` is atomic (temp file in the same folder, fsync, ``os.replace``) and ``load``
  restores a ledger equal (``==``) to the saved one.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from fedpriv.files import write_json_atomic
from fedpriv.privacy.accountants import AccountantKind, make_accountant
from fedpriv.privacy.events import (
    ComposedEvent,
    DpEvent,
    SelfComposedEvent,
    event_from_dict,
    event_to_dict,
)

SCHEMA = "fedpriv.privacy.ledger"
SCHEMA_VERSION = 1
Events = Union[DpEvent, Iterable[DpEvent]]


class LedgerError(ValueError):
    """A ledger file is missing or corrupt, or a retried report contradicts the record."""


class BudgetExceededError(RuntimeError):
    """Recording the events would push a client past its privacy budget."""


@dataclass(frozen=True)
class Budget:
    """An (ε, δ) privacy budget: 0 < ε (∞ allowed), 0 < δ < 1."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and self.epsilon > 0):
            raise ValueError(f"budget epsilon must be > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ValueError(f"budget delta must be in (0, 1), got {self.delta!r}")


def merge_events(events: Iterable[DpEvent]) -> DpEvent:
    """One event equivalent to running ``events`` in sequence, with identical leaf events
    merged: Composed/SelfComposed are unrolled into counts of leaves (mechanisms or
    Poisson-sampled mechanisms), then rebuilt as SelfComposed(leaf, total count) in
    first-seen order. R rounds of dpsgd_event(σ, q, s) become dpsgd_event(σ, q, R·s)."""
    counts: Counter[DpEvent] = Counter()

    def walk(event: DpEvent, n: int) -> None:
        match event:
            case SelfComposedEvent(event=inner, count=k):
                walk(inner, n * k)
            case ComposedEvent(events=inner):
                for e in inner:
                    walk(e, n)
            case _:
                counts[event] += n

    for event in events:
        walk(event, 1)
    merged = tuple(SelfComposedEvent(leaf, n) for leaf, n in counts.items() if n > 0)
    return merged[0] if len(merged) == 1 else ComposedEvent(merged)


def _as_tuple(events: Events) -> tuple[DpEvent, ...]:
    items = (events,) if not isinstance(events, Iterable) else tuple(events)
    for e in items:
        event_to_dict(e)  # raises EventError for anything that is not an event
    return items


class PrivacyLedger:
    """Events per client id (str) and round; budgets; spent ε under one accountant kind."""

    def __init__(
        self,
        budget: Budget,
        accountant: AccountantKind | str = AccountantKind.RDP,
        client_budgets: Mapping[str, Budget] | None = None,
    ) -> None:
        self.budget = budget
        self.accountant = AccountantKind(accountant)
        self.client_budgets: dict[str, Budget] = dict(client_budgets or {})
        self._rounds: dict[str, dict[int, tuple[DpEvent, ...]]] = {}
        self._spent: dict[str, float] = {}

    # --- queries --------------------------------------------------------------------
    def budget_for(self, client: str) -> Budget:
        """The client's own budget if set, else the global one."""
        return self.client_budgets.get(client, self.budget)

    def clients(self) -> list[str]:
        """Client ids with at least one recorded round, sorted."""
        return sorted(self._rounds)

    def rounds(self, client: str) -> dict[int, tuple[DpEvent, ...]]:
        """{round: events} recorded for ``client`` (a copy)."""
        return dict(self._rounds.get(client, {}))

    def events(self, client: str) -> tuple[DpEvent, ...]:
        """All events of ``client`` in round order."""
        return tuple(e for _, evs in sorted(self._rounds.get(client, {}).items()) for e in evs)

    def _epsilon(self, client: str, events: tuple[DpEvent, ...]) -> float:
        if not events:
            return 0.0
        acc = make_accountant(self.accountant).compose(merge_events(events))
        return acc.epsilon(self.budget_for(client).delta)

    def spent(self, client: str) -> float:
        """ε spent by ``client`` at its budget's δ (cached)."""
        if client not in self._spent:
            self._spent[client] = self._epsilon(client, self.events(client))
        return self._spent[client]

    def remaining(self, client: str) -> float:
        """Budget ε minus spent ε, floored at 0."""
        return max(0.0, self.budget_for(client).epsilon - self.spent(client))

    def can_afford(self, client: str, events: Events) -> bool:
        """Would recording ``events`` keep ``client`` within its budget?"""
        after = self._epsilon(client, self.events(client) + _as_tuple(events))
        return after <= self.budget_for(client).epsilon

    # --- mutation -------------------------------------------------------------------
    def record(self, client: str, round: int, events: Events) -> bool:
        """Record ``events`` of ``client`` in ``round``; False if that round is already
        recorded with the same events (a retried report). Raises ``LedgerError`` if it
        was recorded with different events and ``BudgetExceededError`` if the events
        would exceed the budget — in both cases the ledger is unchanged."""
        if not isinstance(client, str):
            raise TypeError(f"client id must be a str, got {client!r}")
        if not isinstance(round, int) or isinstance(round, bool) or round < 0:
            raise ValueError(f"round must be an integer >= 0, got {round!r}")
        new = _as_tuple(events)
        previous = self._rounds.get(client, {}).get(round)
        if previous is not None:
            if previous != new:
                raise LedgerError(
                    f"client {client!r} round {round} was already recorded with different events: "
                    f"{previous!r} != {new!r}"
                )
            return False
        before = self.spent(client)
        after = self._epsilon(client, self.events(client) + new)
        limit = self.budget_for(client)
        if after > limit.epsilon:
            raise BudgetExceededError(
                f"client {client!r}: spent epsilon {before:.4g} would become {after:.4g}, "
                f"over its budget epsilon {limit.epsilon:g} (delta {limit.delta:g}, {self.accountant.value})"
            )
        self._rounds.setdefault(client, {})[round] = new
        self._spent[client] = after
        return True

    # --- persistence ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON form."""
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "accountant": self.accountant.value,
            "budget": {"epsilon": self.budget.epsilon, "delta": self.budget.delta},
            "client_budgets": {c: {"epsilon": b.epsilon, "delta": b.delta} for c, b in sorted(self.client_budgets.items())},
            "clients": {
                c: [{"round": r, "events": [event_to_dict(e) for e in evs]} for r, evs in sorted(rounds.items())]
                for c, rounds in sorted(self._rounds.items())
            },
        }

    @classmethod
    def from_dict(cls, data: Any) -> PrivacyLedger:
        """Inverse of ``to_dict``; raises ``LedgerError`` naming what is wrong."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise LedgerError("not a fedpriv privacy ledger (missing or wrong 'schema')")
        if data.get("version") != SCHEMA_VERSION:
            raise LedgerError(f"unsupported ledger version {data.get('version')!r} (expected {SCHEMA_VERSION})")
        try:
            ledger = cls(
                Budget(**data["budget"]),
                data["accountant"],
                {c: Budget(**b) for c, b in data.get("client_budgets", {}).items()},
            )
            for client, rounds in data["clients"].items():
                for entry in rounds:
                    events = tuple(event_from_dict(e) for e in entry["events"])
                    ledger._rounds.setdefault(client, {})[int(entry["round"])] = events
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise LedgerError(f"corrupt ledger: {err}") from err
        return ledger

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a crash leaves either the old file or the new one."""
        write_json_atomic(path, self.to_dict(), indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PrivacyLedger:
        """Read a ledger written by ``save``; ``LedgerError`` if missing or corrupt."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise LedgerError(f"cannot read ledger file {str(path)!r}: {err.strerror or err}") from err
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise LedgerError(f"corrupt ledger file {str(path)!r}: invalid JSON ({err.msg})") from err
        return cls.from_dict(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyLedger) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]
