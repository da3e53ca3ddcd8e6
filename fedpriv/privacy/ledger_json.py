"""The ledger file's JSON form: its schema name and version, an entry's text as the file
holds it, and the reader of versions 1 and 2 (version 1's integer rounds ``r`` become the
entry keys ``str(r)``, in round order). ``PrivacyLedger.to_dict`` / ``from_dict`` use it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fedpriv.privacy.accountants import AccountantKind
from fedpriv.privacy.budget import Budget
from fedpriv.privacy.events import DpEvent, event_from_dict, event_to_dict

SCHEMA = "fedpriv.privacy.ledger"
SCHEMA_VERSION = 2
_ENTRY_INDENT = "   "  # an entry's depth in the file: the ledger, "clients", the client's list


class LedgerError(ValueError):
    """A ledger file is missing or corrupt, or a retried report contradicts the record."""


def check_client(client: Any) -> None:
    if not isinstance(client, str):
        raise TypeError(f"client id must be a str, got {client!r}")


def check_entry(entry: Any) -> None:
    if not isinstance(entry, str):
        raise TypeError(f"entry key must be a str, got {entry!r}")
    if not entry:
        raise ValueError("entry key must be a non-empty str")


def entry_text(key: str, events: tuple[DpEvent, ...]) -> str:
    """One entry as ``json.dumps(ledger, indent=1)`` writes it at its depth (JSON strings
    hold no raw newline, so every newline is the layout's)."""
    text = json.dumps({"entry": key, "events": [event_to_dict(e) for e in events]}, indent=1)
    return _ENTRY_INDENT + text.replace("\n", "\n" + _ENTRY_INDENT)


@dataclass(frozen=True)
class LedgerContents:
    """What a ledger file holds, checked: the ledger's settings and, per client with at
    least one entry, its entries in recorded order."""

    budget: Budget
    accountant: AccountantKind
    client_budgets: dict[str, Budget]
    ledger_id: str | None
    randomness: str | None
    entries: dict[str, dict[str, tuple[DpEvent, ...]]]


def read_ledger(data: Any) -> LedgerContents:
    """The contents of a ledger's JSON form (version 1 or 2); ``LedgerError`` naming what is wrong."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise LedgerError("not a fedpriv privacy ledger (missing or wrong 'schema')")
    version = data.get("version")
    if type(version) is not int or version not in (1, SCHEMA_VERSION):
        raise LedgerError(f"unsupported ledger version {version!r} (expected 1 or {SCHEMA_VERSION})")
    try:
        budget = Budget(**data["budget"])
        accountant = AccountantKind(data["accountant"])
        client_budgets = {c: Budget(**b) for c, b in data.get("client_budgets", {}).items()}
        ledger_id = data.get("ledger_id")
        if ledger_id is not None and not (isinstance(ledger_id, str) and ledger_id):
            raise ValueError(f"ledger_id must be a non-empty string, got {ledger_id!r}")
        randomness = data.get("randomness")
        if randomness is not None and randomness not in ("secure", "seeded"):
            raise ValueError(f"randomness must be 'secure' or 'seeded', got {randomness!r}")
        clients: dict[str, dict[str, tuple[DpEvent, ...]]] = {}
        for client, items in data["clients"].items():
            check_client(client)
            keyed = [_read_entry(item, version) for item in items]
            if version == 1:
                keyed.sort(key=lambda pair: int(pair[0]))
            entries: dict[str, tuple[DpEvent, ...]] = {}
            for key, events in keyed:
                if key in entries:
                    raise ValueError(f"client {client!r} has entry {key!r} twice")
                entries[key] = events
            if entries:
                clients[client] = entries
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise LedgerError(f"corrupt ledger: {err}") from err
    return LedgerContents(budget, accountant, client_budgets, ledger_id, randomness, clients)


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
        check_entry(key)
    events = item["events"]
    if not isinstance(events, list):
        raise TypeError(f"events of entry {key!r} must be a list, got {events!r}")
    return key, tuple(event_from_dict(e) for e in events)
