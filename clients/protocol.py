"""What the ServerApp and the ClientApp say to each other: record keys and codecs.

- QUERY reply: ``ConfigRecord`` "info" with ``client-id`` (the partition id as a
  string: stable across runs, unlike Flower node ids) and ``num-examples`` (its N).
- TRAIN message: ``ArrayRecord`` "arrays" and ``ConfigRecord`` "config" holding the
  round, this client's noise multiplier and the training plan's settings.
- TRAIN reply: "arrays", ``MetricRecord`` "metrics" (``num-examples``, ``train-loss``)
  and ``ConfigRecord`` "privacy" with ``client-id`` and ``events``: the JSON list of
  the privacy events this round spent, as the client's engine reported them.
- A client that will not train (its own budget) replies with an ``Error`` whose code is
  ``REFUSAL_CODE``; anything else it raises reaches the server as Flower's own error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from flwr.app import ConfigRecord

from fedpriv.privacy.events import DpEvent, EventError, event_from_dict, event_to_dict

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
