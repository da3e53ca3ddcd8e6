"""PrivacyLedger: per-client privacy events under string entry keys, budgets and JSON persistence.

A ledger holds, per client id (str), an ordered list of *entries*: an entry key (a
non-empty str such as ``"run-3f2a/round-2/train"`` or ``"release/num-examples/ab12"``)
and the tuple of events it spent. Entries keep the order in which they were recorded.

Invariants:
- A client's spent ε is the ε, at its budget's δ, of *all* its recorded events merged
  (``fedpriv.privacy.merge``) and composed by one fresh accountant of the ledger's kind. The merge
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
  each round ``r`` becoming the entry key ``str(r)`` (the format and its reader:
  ``fedpriv.privacy.ledger_json``).

For a ledger shared by processes and kept across runs, see ``fedpriv.privacy.store``.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedpriv.files import write_bytes_atomic
from fedpriv.privacy.accountants import AccountantKind, make_accountant
from fedpriv.privacy.budget import Budget
from fedpriv.privacy.events import DpEvent, event_to_dict
from fedpriv.privacy.ledger_json import (
    SCHEMA,
    SCHEMA_VERSION,
    LedgerError,
    check_client,
    check_entry,
    entry_text,
    read_ledger,
)
from fedpriv.privacy.merge import count_leaves, merged_event

EPSILON_MEMO_SIZE = 65536
"""How many (accountant kind, δ, merged event) → ε results ``_epsilon_of`` keeps."""
Events = DpEvent | Iterable[DpEvent]


class BudgetExceededError(RuntimeError):
    """Recording the events would push a client past its privacy budget."""


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
        check_client(client)
        check_entry(entry)
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
            new = ",\n".join(entry_text(key, events) for key, events in itertools.islice(entries.items(), done, None))
            text = f"{text},\n{new}" if done else text + new
            self._texts[client] = (len(entries), text)
        return text

    @classmethod
    def from_dict(cls, data: Any) -> PrivacyLedger:
        """Inverse of ``to_dict``; also reads version 1 (``{"round": r, ...}`` entries
        become entry key ``str(r)``, in round order). Raises ``LedgerError`` naming what is
        wrong."""
        contents = read_ledger(data)
        ledger = cls(contents.budget, contents.accountant, contents.client_budgets)
        ledger.ledger_id = contents.ledger_id
        ledger.randomness = contents.randomness
        ledger._entries = contents.entries
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
