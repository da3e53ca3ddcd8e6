"""PrivacyLedger: per-client privacy events under string entry keys, budgets and JSON persistence.

A ledger holds, per client id (str), an ordered list of *entries*: an entry key (a
non-empty str such as ``"run-3f2a/round-2/train"`` or ``"release/num-examples/ab12"``)
and the tuple of events it spent. Entries keep the order in which they were recorded.

Invariants:
- A client's spent ε is the ε, at its budget's δ, of *all* its recorded events merged
  (``merge_events``) and composed by one fresh accountant of the ledger's kind.
- ``record`` never leaves a client past the budget it checks against (its own, or the one
  passed in): it raises ``BudgetExceededError`` and changes nothing instead. Recording is
  idempotent per (client, entry).
- ``save`` is atomic (temp file in the same folder, fsync, ``os.replace``) and ``load``
  restores a ledger equal (``==``) to the saved one.
- JSON schema version 2; version 1 files (entries tagged by integer rounds) still load,
  each round ``r`` becoming the entry key ``str(r)``.

For a ledger shared by processes and kept across runs, see ``fedpriv.privacy.store``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
SCHEMA_VERSION = 2
Events = DpEvent | Iterable[DpEvent]


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


def _check_client(client: Any) -> None:
    if not isinstance(client, str):
        raise TypeError(f"client id must be a str, got {client!r}")


def _check_entry(entry: Any) -> None:
    if not isinstance(entry, str):
        raise TypeError(f"entry key must be a str, got {entry!r}")
    if not entry:
        raise ValueError("entry key must be a non-empty str")


def _check_budget(budget: Any) -> None:
    if not isinstance(budget, Budget):
        raise TypeError(f"budget must be a Budget, got {budget!r}")


def _check_delta(delta: Any) -> None:
    if not (isinstance(delta, (int, float)) and not isinstance(delta, bool) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


class PrivacyLedger:
    """Events per client id (str) and entry key (str, in recorded order); budgets; spent ε
    under one accountant kind."""

    def __init__(
        self,
        budget: Budget,
        accountant: AccountantKind | str = AccountantKind.RDP,
        client_budgets: Mapping[str, Budget] | None = None,
    ) -> None:
        self.budget = budget
        self.accountant = AccountantKind(accountant)
        self.client_budgets: dict[str, Budget] = dict(client_budgets or {})
        self.ledger_id: str | None = None  # a node's ledger identity (``fedpriv.node``); None: none given
        self.randomness: str | None = None  # a node's: "seeded" once any booking was; None: not a node's
        self._entries: dict[str, dict[str, tuple[DpEvent, ...]]] = {}
        # ε of all of a client's events, per client and (accountant kind, δ): a value is
        # only ever read back for the kind and δ it was computed at, so changing
        # ``budget``, ``client_budgets`` or ``accountant`` later, or checking against
        # another budget, never returns a stale number. Reset per client by ``record``.
        self._spent: dict[str, dict[tuple[AccountantKind, float], float]] = {}

    # --- queries --------------------------------------------------------------------
    def budget_for(self, client: str) -> Budget:
        """The client's own budget if set, else the global one."""
        return self.client_budgets.get(client, self.budget)

    def clients(self) -> list[str]:
        """Client ids with at least one recorded entry, sorted."""
        return sorted(self._entries)

    def entries(self, client: str) -> dict[str, tuple[DpEvent, ...]]:
        """{entry key: events} recorded for ``client``, in recorded order (a copy)."""
        return dict(self._entries.get(client, {}))

    def has_entry(self, client: str, entry: str) -> bool:
        """Is ``entry`` recorded for ``client``?"""
        return entry in self._entries.get(client, {})

    def events(self, client: str) -> tuple[DpEvent, ...]:
        """All events of ``client`` in recorded order."""
        return tuple(e for evs in self._entries.get(client, {}).values() for e in evs)

    def _epsilon(self, events: tuple[DpEvent, ...], delta: float) -> float:
        if not events:
            return 0.0
        return make_accountant(self.accountant).compose(merge_events(events)).epsilon(delta)

    def _spent_at(self, client: str, delta: float) -> float:
        cache = self._spent.setdefault(client, {})
        key = (self.accountant, delta)
        if key not in cache:
            cache[key] = self._epsilon(self.events(client), delta)
        return cache[key]

    def spent(self, client: str) -> float:
        """ε spent by ``client`` at its budget's δ (cached)."""
        return self._spent_at(client, self.budget_for(client).delta)

    def spent_at(self, client: str, delta: float) -> float:
        """ε spent by ``client`` at ``delta``."""
        _check_delta(delta)
        return self._spent_at(client, delta)

    def remaining(self, client: str) -> float:
        """Budget ε minus spent ε, floored at 0."""
        return max(0.0, self.budget_for(client).epsilon - self.spent(client))

    def can_afford(self, client: str, events: Events, budget: Budget | None = None) -> bool:
        """Would recording ``events`` keep ``client`` within ``budget`` (default: its own,
        ``budget_for(client)``)? ε is computed at that budget's δ."""
        limit = self.budget_for(client) if budget is None else budget
        _check_budget(limit)
        after = self._epsilon(self.events(client) + _as_tuple(events), limit.delta)
        return after <= limit.epsilon

    # --- mutation -------------------------------------------------------------------
    def record(self, client: str, entry: str, events: Events, budget: Budget | None = None) -> bool:
        """Record ``events`` of ``client`` under the key ``entry``; False if that entry is
        already recorded with the same events (a retried report). Raises ``LedgerError`` if
        it was recorded with different events and ``BudgetExceededError`` if the events
        would exceed ``budget`` (default: ``budget_for(client)``; ε at its δ) — in both
        cases the ledger is unchanged."""
        _check_client(client)
        _check_entry(entry)
        limit = self.budget_for(client) if budget is None else budget
        _check_budget(limit)
        new = _as_tuple(events)
        previous = self._entries.get(client, {}).get(entry)
        if previous is not None:
            if previous != new:
                raise LedgerError(
                    f"client {client!r} entry {entry!r} was already recorded with different events: "
                    f"{previous!r} != {new!r}"
                )
            return False
        before = self._spent_at(client, limit.delta)
        after = self._epsilon(self.events(client) + new, limit.delta)
        if after > limit.epsilon:
            raise BudgetExceededError(
                f"client {client!r}: spent epsilon {before:.4g} would become {after:.4g}, "
                f"over its budget epsilon {limit.epsilon:g} (delta {limit.delta:g}, {self.accountant.value})"
            )
        self._entries.setdefault(client, {})[entry] = new
        self._spent[client] = {(self.accountant, limit.delta): after}
        return True

    # --- persistence ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON form (schema version 2); ``ledger_id`` and ``randomness`` only where set."""
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            **({"ledger_id": self.ledger_id} if self.ledger_id is not None else {}),
            **({"randomness": self.randomness} if self.randomness is not None else {}),
            "accountant": self.accountant.value,
            "budget": {"epsilon": self.budget.epsilon, "delta": self.budget.delta},
            "client_budgets": {c: {"epsilon": b.epsilon, "delta": b.delta}
                               for c, b in sorted(self.client_budgets.items())},
            "clients": {
                c: [{"entry": key, "events": [event_to_dict(e) for e in evs]} for key, evs in entries.items()]
                for c, entries in sorted(self._entries.items())
            },
        }

    @classmethod
    def from_dict(cls, data: Any) -> PrivacyLedger:
        """Inverse of ``to_dict``; also reads version 1 (``{"round": r, ...}`` entries
        become entry key ``str(r)``, in round order). Raises ``LedgerError`` naming what is
        wrong."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise LedgerError("not a fedpriv privacy ledger (missing or wrong 'schema')")
        version = data.get("version")
        if type(version) is not int or version not in (1, SCHEMA_VERSION):
            raise LedgerError(f"unsupported ledger version {version!r} (expected 1 or {SCHEMA_VERSION})")
        try:
            ledger = cls(
                Budget(**data["budget"]),
                data["accountant"],
                {c: Budget(**b) for c, b in data.get("client_budgets", {}).items()},
            )
            ledger_id = data.get("ledger_id")
            if ledger_id is not None and not (isinstance(ledger_id, str) and ledger_id):
                raise ValueError(f"ledger_id must be a non-empty string, got {ledger_id!r}")
            ledger.ledger_id = ledger_id
            randomness = data.get("randomness")
            if randomness is not None and randomness not in ("secure", "seeded"):
                raise ValueError(f"randomness must be 'secure' or 'seeded', got {randomness!r}")
            ledger.randomness = randomness
            for client, items in data["clients"].items():
                _check_client(client)
                keyed = [_read_entry(item, version) for item in items]
                if version == 1:
                    keyed.sort(key=lambda pair: int(pair[0]))
                entries: dict[str, tuple[DpEvent, ...]] = {}
                for key, events in keyed:
                    if key in entries:
                        raise ValueError(f"client {client!r} has entry {key!r} twice")
                    entries[key] = events
                if entries:
                    ledger._entries[client] = entries
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
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else err
            raise LedgerError(f"cannot read ledger file {str(path)!r}: {reason}") from err
        return cls.from_json(text, path)

    @classmethod
    def from_json(cls, text: str, path: str | os.PathLike[str] = "<string>") -> PrivacyLedger:
        """Parse the JSON text of a ledger file (``path`` only names it in errors)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise LedgerError(f"corrupt ledger file {str(path)!r}: invalid JSON ({err.msg})") from err
        return cls.from_dict(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyLedger) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


def _read_entry(item: Any, version: int) -> tuple[str, tuple[DpEvent, ...]]:
    if not isinstance(item, dict):
        raise TypeError(f"an entry must be an object, got {item!r}")
    if version == 1:
        r = item["round"]
        if type(r) is not int or r < 0:
            raise ValueError(f"round must be an integer >= 0, got {r!r}")
        key = str(r)
    else:
        key = item["entry"]
        _check_entry(key)
    events = item["events"]
    if not isinstance(events, list):
        raise TypeError(f"events of entry {key!r} must be a list, got {events!r}")
    return key, tuple(event_from_dict(e) for e in events)
