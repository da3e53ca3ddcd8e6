"""PrivacyLedger: per-client privacy events under string entry keys, budgets and JSON persistence.

A ledger holds, per client id (str), an ordered list of *entries*: an entry key (a
non-empty str such as ``"run-3f2a/round-2/train"`` or ``"release/num-examples/ab12"``)
and the tuple of events it spent. Entries keep the order in which they were recorded.

Invariants:
- A client's spent ε is the ε, at its budget's δ, of *all* its recorded events merged
  (``merge_events``) and composed by one fresh accountant of the ledger's kind. The merge
  is kept per client and extended by each record (not redone over its history), and ε is
  memoised per (accountant kind, δ, merged event), so a round that books the same event
  for 1,000 clients with equal histories runs the accountant once, whatever the round.
- ``record`` never leaves a client past the budget it checks against (its own, or the one
  passed in): it raises ``BudgetExceededError`` and changes nothing instead. Recording is
  idempotent per (client, entry).
- ``save`` is atomic (temp file in the same folder, fsync, ``os.replace``) and ``load``
  restores a ledger equal (``==``) to the saved one. The file's text is
  ``json.dumps(to_dict(), indent=1)``; ``to_json`` writes it from each entry's text, encoded
  once (entries never change once recorded).
- JSON schema version 2; version 1 files (entries tagged by integer rounds) still load,
  each round ``r`` becoming the entry key ``str(r)``.

For a ledger shared by processes and kept across runs, see ``fedpriv.privacy.store``.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedpriv.files import write_bytes_atomic
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
EPSILON_MEMO_SIZE = 65536
"""How many (accountant kind, δ, merged event) → ε results ``_epsilon_of`` keeps."""
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


def count_leaves(events: Iterable[DpEvent], counts: Mapping[DpEvent, int] | None = None) -> dict[DpEvent, int]:
    """{leaf: count} of ``events`` run in sequence, added to a copy of ``counts``: Composed
    and SelfComposed unrolled into counts of leaves (mechanisms or Poisson-sampled
    mechanisms), in first-seen order (a leaf seen with count 0 keeps its place)."""
    out = dict(counts or {})

    def walk(event: DpEvent, n: int) -> None:
        match event:
            case SelfComposedEvent(event=inner, count=k):
                walk(inner, n * k)
            case ComposedEvent(events=inner):
                for e in inner:
                    walk(e, n)
            case _:
                out[event] = out.get(event, 0) + n

    for event in events:
        walk(event, 1)
    return out


def merged_event(counts: Mapping[DpEvent, int]) -> DpEvent:
    """SelfComposed(leaf, count) of each leaf with count > 0, in order; one event or a Composed."""
    merged = tuple(SelfComposedEvent(leaf, n) for leaf, n in counts.items() if n > 0)
    return merged[0] if len(merged) == 1 else ComposedEvent(merged)


def merge_events(events: Iterable[DpEvent]) -> DpEvent:
    """One event equivalent to running ``events`` in sequence, with identical leaf events
    merged (``count_leaves``), rebuilt as SelfComposed(leaf, total count) in first-seen
    order. R rounds of dpsgd_event(σ, q, s) become dpsgd_event(σ, q, R·s)."""
    return merged_event(count_leaves(events))


@functools.lru_cache(maxsize=EPSILON_MEMO_SIZE)
def _epsilon_of(kind: AccountantKind, delta: float, merged: DpEvent) -> float:
    """ε at ``delta`` of the merged event under a fresh accountant of ``kind`` (memoised:
    accountants are deterministic, so clients with equal merged histories share one)."""
    return make_accountant(kind).compose(merged).epsilon(delta)


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
        # Derived from ``_entries``, kept because entries never change once recorded:
        # per client, ``count_leaves`` of all its events (built on first use, replaced, never
        # mutated, by ``record``), so spent ε needs no walk over its history; and per client,
        # how many of its first entries ``to_json`` has encoded and their text (extended by
        # the next save), so a save encodes only new entries.
        self._counts: dict[str, dict[DpEvent, int]] = {}
        self._texts: dict[str, tuple[int, str]] = {}

    def copy(self) -> PrivacyLedger:
        """An equal ledger that shares nothing mutable with this one (cheap: events and
        their derived forms are immutable, only the per-client tables are copied)."""
        other = PrivacyLedger(self.budget, self.accountant, self.client_budgets)
        other.ledger_id = self.ledger_id
        other.randomness = self.randomness
        other._entries = {c: dict(entries) for c, entries in self._entries.items()}
        other._counts = dict(self._counts)
        other._texts = dict(self._texts)
        return other

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

    def _leaf_counts(self, client: str) -> dict[DpEvent, int]:
        counts = self._counts.get(client)
        if counts is None:
            counts = self._counts[client] = count_leaves(self.events(client))
        return counts

    def _epsilon(self, counts: Mapping[DpEvent, int], delta: float) -> float:
        """ε at ``delta`` of events with these leaf counts: 0 for none (or only count-0
        ones, whose merged event every accountant rates 0), else the memoised accountant's."""
        if not any(counts.values()):
            return 0.0
        return _epsilon_of(self.accountant, delta, merged_event(counts))

    def _spent_at(self, client: str, delta: float) -> float:
        return self._epsilon(self._leaf_counts(client), delta)

    def spent(self, client: str) -> float:
        """ε spent by ``client`` at its budget's δ (memoised)."""
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
        after = self._epsilon(count_leaves(_as_tuple(events), self._leaf_counts(client)), limit.delta)
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
        counts = count_leaves(new, self._leaf_counts(client))
        after = self._epsilon(counts, limit.delta)
        if after > limit.epsilon:
            raise BudgetExceededError(
                f"client {client!r}: spent epsilon {before:.4g} would become {after:.4g}, "
                f"over its budget epsilon {limit.epsilon:g} (delta {limit.delta:g}, {self.accountant.value})"
            )
        self._entries.setdefault(client, {})[entry] = new
        self._counts[client] = counts
        return True

    # --- persistence ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON form (schema version 2); ``ledger_id`` and ``randomness`` only where set."""
        return {
            **self._head(),
            "clients": {
                c: [{"entry": key, "events": [event_to_dict(e) for e in evs]} for key, evs in entries.items()]
                for c, entries in sorted(self._entries.items())
            },
        }

    def to_json(self) -> str:
        """``json.dumps(self.to_dict(), indent=1)``, character for character (the file's
        text), joined from each entry's text, encoded once per entry: a save of a ledger
        that grows by N entries a round encodes N entries, not all of them."""
        head = json.dumps({**self._head(), "clients": {}}, indent=1)
        if not self._entries:
            return head
        parts = [head[:-len("{}\n}")], "{\n"]
        for i, client in enumerate(sorted(self._entries)):
            parts += (",\n" if i else "", self._client_text(client), "\n  ]")
        parts.append("\n }\n}")
        return "".join(parts)

    def _head(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            **({"ledger_id": self.ledger_id} if self.ledger_id is not None else {}),
            **({"randomness": self.randomness} if self.randomness is not None else {}),
            "accountant": self.accountant.value,
            "budget": {"epsilon": self.budget.epsilon, "delta": self.budget.delta},
            "client_budgets": {c: {"epsilon": b.epsilon, "delta": b.delta}
                               for c, b in sorted(self.client_budgets.items())},
        }

    def _client_text(self, client: str) -> str:
        """``client``'s key and entries as in ``to_json`` (without the closing bracket),
        extended by the entries recorded since the last call."""
        entries = self._entries[client]
        done, text = self._texts.get(client, (0, f"  {json.dumps(client)}: [\n"))
        if done < len(entries):
            new = ",\n".join(_entry_text(key, events) for key, events in itertools.islice(entries.items(), done, None))
            text = f"{text},\n{new}" if done else text + new
            self._texts[client] = (len(entries), text)
        return text

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
        write_bytes_atomic(path, self.to_json().encode("utf-8"))

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


_ENTRY_INDENT = "   "  # an entry's depth in the file: the ledger, "clients", the client's list


def _entry_text(key: str, events: tuple[DpEvent, ...]) -> str:
    """One entry as ``json.dumps(ledger, indent=1)`` writes it at its depth (JSON strings
    hold no raw newline, so every newline is the layout's)."""
    text = json.dumps({"entry": key, "events": [event_to_dict(e) for e in events]}, indent=1)
    return _ENTRY_INDENT + text.replace("\n", "\n" + _ENTRY_INDENT)
