"""What the ServerApp and the ClientApp say to each other: record keys and codecs.

- QUERY reply: ``ConfigRecord`` "info" with ``client-id`` (the partition id as a
  string: stable across runs, unlike Flower node ids) and ``num-examples`` (its N).
- TRAIN message: ``ArrayRecord`` "arrays" and ``ConfigRecord`` "config" holding
  ``server-round`` and this client's ``TrainingPlan`` (its own σ), one key per field
  in kebab-case (``plan_config`` / ``read_plan``).
- EVALUATE message: "arrays" and "config" with ``model`` (the architecture's name).
- TRAIN reply: "arrays", ``MetricRecord`` "metrics" (``num-examples``, ``train-loss``)
  and ``ConfigRecord`` "privacy" with ``client-id`` and ``events``: the JSON list of
  the privacy events this round spent, as the client's engine reported them.
- A client that will not train (its own budget) replies with an ``Error`` whose code is
  ``REFUSAL_CODE``; anything else it raises reaches the server as Flower's own error.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from flwr.app import ConfigRecord

from fedpriv.privacy.events import DpEvent, EventError, event_from_dict, event_to_dict
from fedpriv.training import TrainingPlan

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
PRIVACY = "privacy"
INFO = "info"
CLIENT_ID = "client-id"
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
TRAIN_METRICS = frozenset({NUM_EXAMPLES, TRAIN_LOSS})
EVENTS = "events"
SERVER_ROUND = "server-round"
MODEL = "model"
REFUSAL_CODE = 4290


def events_record(client_id: str, events: Sequence[DpEvent]) -> ConfigRecord:
    """The "privacy" record of a train reply."""
    return ConfigRecord(
        {CLIENT_ID: client_id, EVENTS: json.dumps([event_to_dict(e) for e in events])}
    )


def read_events(record: ConfigRecord) -> tuple[DpEvent, ...]:
    """Events from a "privacy" record; raises ``EventError`` when malformed."""
    try:
        data = json.loads(str(record[EVENTS]))
    except (KeyError, json.JSONDecodeError) as err:
        raise EventError(f"no readable '{EVENTS}' in privacy record: {err}") from err
    if not isinstance(data, list):
        raise EventError(f"'{EVENTS}' must be a JSON list, got {type(data).__name__}")
    return tuple(event_from_dict(item) for item in data)


def plan_config(plan: TrainingPlan) -> dict[str, Any]:
    """A plan as kebab-case ConfigRecord values (enums as their strings; unset optional
    fields left out, ``read_plan`` restores their default)."""
    return {
        f.name.replace("_", "-"): str(v) if isinstance(v, str) else v
        for f in dataclasses.fields(plan)
        if (v := getattr(plan, f.name)) is not None
    }


def read_plan(config: Mapping[str, Any]) -> TrainingPlan:
    """The plan in a TRAIN message's config; other keys (``server-round``) are ignored."""
    fields = {f.name: f for f in dataclasses.fields(TrainingPlan)}
    values = {}
    for name, field in fields.items():
        key = name.replace("_", "-")
        if key in config:
            values[name] = config[key]
        elif field.default is dataclasses.MISSING:
            raise ValueError(f"train config lacks '{key}'")
    return TrainingPlan(**values)
