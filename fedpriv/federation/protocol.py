"""What the ServerApp and the ClientApp say to each other: record keys, entry keys, codecs.

Every field a peer sends is untrusted input to the other: the readers here raise
``ProtocolError`` (a ``ValueError``) on anything malformed.

- QUERY reply: ``ConfigRecord`` "info" with ``client-id`` (the partition id as a string:
  stable across runs, unlike Flower node ids), ``num-examples`` (a DP count of N, or N
  itself where the node's policy declares it public) and ``num-examples-public``;
  ``ConfigRecord`` "privacy" with ``entries`` (JSON: the ledger entries the node booked to
  make this reply, {entry: [events]}) and ``evaluate-events`` (JSON list: what one
  EVALUATE answer costs; empty when the node does not evaluate).
- TRAIN: ``ArrayRecord`` "arrays", ``ConfigRecord`` "config" with the ``TrainingPlan``
  (``plan_config``), ``server-round`` and ``run-key``.
- Distributed TRAIN (``privacy = "distributed"``): secure aggregation's stages
  (``clients.secure_sum``); the stage that collects the masked vectors carries "arrays"
  and "config" with the plan, ``sample-rate``, ``lattice-scale``, ``lattice-rounding`` and
  ``modulus-bits``; its
  reply, the masked vector and the "privacy" record.
- TRAIN reply: "arrays" and the "privacy" record (``entry``, ``events``). Nothing else
  leaves the client: no loss, no N.
- EVALUATE: "arrays" and "config" with ``model``, ``server-round`` and ``run-key``.
  Reply: ``MetricRecord`` "metrics" with noisy ``count``, ``correct``, ``loss-sum`` and
  the "privacy" record.
- A client that will not train or answer replies with an ``Error`` whose code is
  ``REFUSAL_CODE`` (its budget, its policy, a malformed message) and a reason saying why,
  decided before anything is booked from the message, the policy and the ledger alone.
  An answer that fails otherwise (after its booking, or on an unexpected error) replies
  ``FAILURE_CODE`` with a fixed reason (``FAILED_AFTER_BOOKING`` or ``FAILED``): an
  error's own text could carry the node's data (e.g. the exact size of a shape).

Entry keys name one release in a ledger: ``<run-key>/round-<r>/train`` (or
``/evaluate``). The server chooses the run key; a node never books one key twice and
never answers a key it has booked, so a replayed key is refused, never run again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from flwr.app import ConfigRecord

from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import DpEvent, EventError, event_from_dict, event_to_dict
from fedpriv.training import TrainingPlan

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
PRIVACY = "privacy"
INFO = "info"
CLIENT_ID = "client-id"
NUM_EXAMPLES = "num-examples"
NUM_EXAMPLES_PUBLIC = "num-examples-public"
ENTRY = "entry"
ENTRIES = "entries"
EVENTS = "events"
EVALUATE_EVENTS = "evaluate-events"
SERVER_ROUND = "server-round"
RUN_KEY = "run-key"
MODEL = "model"
COUNT, CORRECT, LOSS_SUM = "count", "correct", "loss-sum"
SAMPLE_RATE, LATTICE_SCALE, MODULUS_BITS = "sample-rate", "lattice-scale", "modulus-bits"
LATTICE_ROUNDING = "lattice-rounding"
"""What a distributed round's config adds to the plan: the shared q and the lattice."""
EVALUATE_METRICS = frozenset({COUNT, CORRECT, LOSS_SUM})
REFUSAL_CODE = 4290
FAILURE_CODE = 5000
FAILED_AFTER_BOOKING = "the release failed after it was booked; nothing was sent (details in the node's log)"
FAILED = "the node failed to answer (details in its log)"
_RUN_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class ProtocolError(ValueError):
    """A message field is missing or malformed."""


def is_finite_number(value: Any) -> TypeGuard[int | float]:
    """Whether ``value`` from the wire is a finite real number: an int or a float, not a
    bool (TOML's and JSON's true is an int to Python), not NaN or ±∞."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def train_entry(run_key: str, server_round: int) -> str:
    """The ledger entry of one TRAIN."""
    return f"{check_run_key(run_key)}/round-{server_round}/train"


def evaluate_entry(run_key: str, server_round: int) -> str:
    """The ledger entry of one EVALUATE."""
    return f"{check_run_key(run_key)}/round-{server_round}/evaluate"


def check_run_key(run_key: Any) -> str:
    """``run_key`` if it is 1–64 of ``[A-Za-z0-9_.-]``; else ``ProtocolError``."""
    if not isinstance(run_key, str) or not _RUN_KEY.fullmatch(run_key):
        raise ProtocolError(f"bad run key {run_key!r}: 1-64 characters of [A-Za-z0-9_.-]")
    return run_key


def read_round(config: Mapping[str, Any]) -> tuple[str, int]:
    """(run key, server round) of a TRAIN or EVALUATE config."""
    try:
        run_key, server_round = config[RUN_KEY], config[SERVER_ROUND]
    except KeyError as err:
        raise ProtocolError(f"config lacks {err}") from None
    if isinstance(server_round, bool) or not isinstance(server_round, int) or server_round < 1:
        raise ProtocolError(f"bad server round {server_round!r}")
    return check_run_key(run_key), server_round


def _events_json(events: Sequence[DpEvent]) -> str:
    return json.dumps([event_to_dict(e) for e in events])


def _read_events_json(text: Any) -> tuple[DpEvent, ...]:
    try:
        data = json.loads(str(text))
    except json.JSONDecodeError as err:
        raise ProtocolError(f"events are not JSON: {err}") from err
    return _events_from_list(data)


def _events_from_list(data: Any) -> tuple[DpEvent, ...]:
    """Events from their decoded JSON form (a list of event dicts)."""
    if not isinstance(data, list):
        raise ProtocolError(f"events must be a JSON list, got {type(data).__name__}")
    try:
        return tuple(event_from_dict(item) for item in data)
    except EventError as err:
        raise ProtocolError(str(err)) from err


def charge_record(charge: Charge) -> ConfigRecord:
    """The "privacy" record of a TRAIN or EVALUATE reply (or a classic release): the charge
    the node booked."""
    return ConfigRecord({ENTRY: charge.entry, EVENTS: _events_json(charge.events)})


def read_charge(record: ConfigRecord) -> Charge:
    """The charge in a "privacy" record."""
    if ENTRY not in record or EVENTS not in record:
        raise ProtocolError(f"privacy record needs '{ENTRY}' and '{EVENTS}'")
    return Charge(str(record[ENTRY]), _read_events_json(record[EVENTS]))


def releases_record(entries: Mapping[str, Sequence[DpEvent]], evaluate_events: Sequence[DpEvent]) -> ConfigRecord:
    """The "privacy" record of a QUERY reply."""
    return ConfigRecord({
        ENTRIES: json.dumps({entry: [event_to_dict(e) for e in evs] for entry, evs in entries.items()}),
        EVALUATE_EVENTS: _events_json(evaluate_events),
    })


def read_releases(record: ConfigRecord) -> tuple[dict[str, tuple[DpEvent, ...]], tuple[DpEvent, ...]]:
    """({entry: events} booked for a QUERY reply, the events of one EVALUATE answer)."""
    try:
        data = json.loads(str(record[ENTRIES]))
        evaluate = record[EVALUATE_EVENTS]
    except (KeyError, json.JSONDecodeError) as err:
        raise ProtocolError(f"unreadable privacy record: {err}") from err
    if not isinstance(data, dict):
        raise ProtocolError("'entries' must map entry keys to event lists")
    entries = {entry: _events_from_list(evs) for entry, evs in data.items()}
    return entries, _read_events_json(evaluate)


def plan_config(plan: TrainingPlan) -> dict[str, str | int | float]:
    """A plan as kebab-case ConfigRecord values (enums as their strings; unset optional
    fields left out, ``read_plan`` restores their default)."""
    return {
        f.name.replace("_", "-"): str(v) if isinstance(v, str) else v
        for f in dataclasses.fields(plan)
        if (v := getattr(plan, f.name)) is not None
    }


def read_plan(config: Mapping[str, Any]) -> TrainingPlan:
    """The plan in a TRAIN message's config; other keys (``server-round``) are ignored."""
    values = {}
    for f in dataclasses.fields(TrainingPlan):
        key = f.name.replace("_", "-")
        if key in config:
            values[f.name] = config[key]
        elif f.default is dataclasses.MISSING:
            raise ProtocolError(f"train config lacks '{key}'")
    try:
        return TrainingPlan(**values)
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"bad training plan: {err}") from err
