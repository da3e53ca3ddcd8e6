"""Everything a node releases besides model updates, each through a booked Gaussian mechanism.

- The size N of its training partition: a count (sensitivity 1 under add/remove of one
  record) plus N(0, s²), rounded and floored at 1 (post-processing). It is released once
  per data partition and stored in the node's state folder, so later runs resend the same
  value at no extra cost. Each draw has its own ledger entry, booked before the value is
  stored or sent: a crash can only over-charge.
- An evaluation: the integers (count, correct, Σ_i round(min(loss_i, L)/L · K)), K =
  ``LOSS_STEPS``, each moved by at most (1, 1, K) by one record, get discrete Gaussian noise
  N_Z(0, s²), N_Z(0, s²), N_Z(0, (sK)²) (``fedpriv.mechanisms.gaussian``): every output is an
  integer (the loss sum a multiple of L/K), so no double's low bits tell two inputs apart.

Where the policy says ``public-num-examples``, N is sent as is and books nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedpriv.federation.policy import NodePolicy, Randomness
from fedpriv.federation.releases import node_noise, noisy_count
from fedpriv.federation.settings import RunSettings
from fedpriv.files import write_json_atomic
from fedpriv.privacy import Budget, BudgetExceededError, LedgerError
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import DpEvent, event_from_dict, event_to_dict
from fedpriv.privacy.store import LedgerStore


class Refusal(Exception):
    """The node will not do what a message asks; the reason goes back to the server."""


def missing_data(dataset: str) -> Refusal:
    """The refusal of a node whose policy's ``data-dir`` lacks ``dataset``; it does not name
    the folder (a node's paths are none of the server's business)."""
    return Refusal(f"this node holds no {dataset} in its policy's data-dir")


@dataclass(frozen=True)
class ReleasedSize:
    """The N a node sends: its value, whether it is exact, and the entries that paid for it."""

    value: int
    public: bool
    entries: Mapping[str, tuple[DpEvent, ...]]


def data_key(policy: NodePolicy, settings: RunSettings, node_config: Mapping[str, Any]) -> str:
    """Which records a partition holds, as a short hash of what chooses them."""
    described = [settings.dataset, settings.partition.value, settings.alpha, policy.partition_key,
                 settings.limit_train, str(node_config["partition-id"]), str(node_config["num-partitions"])]
    if settings.task is not None:  # a user's task: its module's name (unset: the key of earlier releases)
        described.append(settings.task)
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


def book(policy: NodePolicy, client: str, charge: Charge, budget: Budget) -> int:
    """Book ``charge`` for ``client`` in the node's durable ledger, or raise ``Refusal``
    (entry already booked, or over ``budget``: one accountant composition decides). Returns
    how many entries the client had before: an ordinal that never repeats."""
    entry = charge.entry
    with LedgerStore(policy.ledger_path).transaction(policy.budget, policy.accountant) as ledger:
        if ledger.ledger_id is None:  # gone since the handler's check_ledger, or never initialised
            raise Refusal("this node's ledger is not initialised or is gone: it books nothing")
        if ledger.has_entry(client, entry):
            raise Refusal(f"client {client} already ran {entry}; a node never answers one entry twice")
        ordinal = len(ledger.entries(client))
        if ledger.randomness != Randomness.SEEDED:  # seeded sticks: the weakest noise this ledger's ε rests on
            ledger.randomness = policy.randomness.value
        try:
            ledger.record(client, entry, charge.events, budget=budget)
        except BudgetExceededError as err:
            raise Refusal(f"client {client} refuses {entry}: it would exceed its budget ε = {budget.epsilon:g} "
                          f"at δ = {budget.delta:g} (spent ε = {ledger.spent_at(client, budget.delta):.4f})") from err
    return ordinal


def released_size(policy: NodePolicy, settings: RunSettings, node_config: Mapping[str, Any],
                  client: str, num_examples: int) -> ReleasedSize:
    """The N this node sends for its partition: exact where public, else its DP count (drawn
    and booked on first use, then reused)."""
    if policy.public_num_examples:
        return ReleasedSize(num_examples, True, {})
    key = data_key(policy, settings, node_config)
    stored = _read_releases(policy).get(key)
    if stored is None:
        events: tuple[DpEvent, ...] = (policy.num_examples_event(),)
        entry = f"release/num-examples/{key}/{secrets.token_hex(4)}"  # one entry per draw
        ordinal = book(policy, client, Charge(entry, events), policy.effective_budget(settings))
        noise = float(node_noise(policy, 1, policy.num_examples_noise, "num-examples", key, ordinal)[0])
        stored = {"value": noisy_count(num_examples, noise), "entry": entry,
                  "events": [event_to_dict(e) for e in events]}
        releases = _read_releases(policy)  # again: another run may have released another partition meanwhile
        releases[key] = stored
        write_json_atomic(policy.releases_path, releases)
    events = tuple(event_from_dict(e) for e in stored["events"])
    return ReleasedSize(int(stored["value"]), False, {str(stored["entry"]): events})


def stored_size(policy: NodePolicy, settings: RunSettings, node_config: Mapping[str, Any],
                num_examples: int) -> int:
    """The N this node released for its partition (``Refusal`` if it never did)."""
    if policy.public_num_examples:
        return num_examples
    stored = _read_releases(policy).get(data_key(policy, settings, node_config))
    if stored is None:
        raise Refusal("this node has released no size for this data partition: the server must QUERY it first")
    return int(stored["value"])


def _read_releases(policy: NodePolicy) -> dict[str, Any]:
    try:
        return json.loads(policy.releases_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as err:  # the path is logged here, never sent
        logging.getLogger(__name__).error("%s: %s", policy.releases_path, err)
        reason = (err.strerror or type(err).__name__) if isinstance(err, OSError) else err.msg
        raise LedgerError(f"corrupt releases file {policy.releases_path.name!r}: {reason}") from err
