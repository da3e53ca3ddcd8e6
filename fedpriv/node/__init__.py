"""A node's ledger identity: a node tells "never used" from "lost" and refuses both.

A missing ledger file used to mean an empty ledger: a lost disk, a tmpfs after a reboot or
a restore that missed one file reset the node's spent ε to 0. Now a node's ledger is made
once, by ``python -m fedpriv.node init --policy P`` (its operator's act), with a random
``ledger_id`` stored in the ledger file, and that id is recorded beside the policy file
(``P.ledger-ids``: JSON, the ledger's folder → its id; one policy file may serve several
partitions, as in the simulations, each with its own ``state-dir``). Losing the state folder
does not lose that record, so before it answers anything (``checked_policy``) a node refuses

- when no id is recorded for its ledger: not initialised, run ``init``;
- when one is recorded but the ledger file is gone: restore ledger.json from its backup;
- when the ledger file holds another id: a wrong backup, restore the node's own.

The refusals name what to restore, never a path (they reach the server); the paths are
logged locally. ``init`` refuses a ledger already recorded; a ledger from before ledger
ids (no id, no record) is adopted with its entries.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedpriv.federation.policy import NodePolicy, Randomness, load_policy
from fedpriv.federation.seeded import warn_seeded
from fedpriv.files import write_json_atomic
from fedpriv.privacy import LedgerError
from fedpriv.privacy.store import LedgerStore

log = logging.getLogger(__name__)

INIT = "python -m fedpriv.node init --policy <its policy file> [--partition-id N]"


def ids_path(policy_file: Path) -> Path:
    """Where the ids of the ledgers of ``policy_file``'s nodes are recorded: beside it."""
    return policy_file.with_name(policy_file.name + ".ledger-ids")


def recorded_id(policy: NodePolicy) -> str | None:
    """The id recorded for the policy's ledger; None if it was never initialised."""
    if policy.policy_file is None:
        return None
    path = ids_path(policy.policy_file)
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        log.error("%s: %s", path, err)
        raise LedgerError("this node's record of its ledger ids is unreadable: restore it from its backup") from err
    recorded = ids.get(str(policy.state_dir)) if isinstance(ids, dict) else None
    return recorded if isinstance(recorded, str) else None


def check_ledger(policy: NodePolicy) -> None:
    """``LedgerError`` (naming no path) unless the policy's ledger is the one it was initialised with."""
    recorded = recorded_id(policy)
    store = LedgerStore(policy.ledger_path)
    if recorded is None:
        log.error("no ledger id recorded for %s (policy file %s)", policy.state_dir, policy.policy_file)
        raise LedgerError(f"this node is not initialised: run `{INIT}` (it needs its policy in a policy file)")
    if not store.exists():
        log.error("ledger %s (id %s) is gone", policy.ledger_path, recorded)
        raise LedgerError("this node's ledger was initialised but is gone: restore ledger.json from its backup")
    if store.read().ledger_id != recorded:
        log.error("ledger %s is not ledger %s", policy.ledger_path, recorded)
        raise LedgerError("this node's ledger.json is not the one it was initialised with (a wrong backup?): "
                          "restore its own from its backup")


def checked_policy(node_config: Mapping[str, Any]) -> NodePolicy:
    """The node's policy (``load_policy``), once ``check_ledger`` has passed: what every handler
    reads first. A node that acts under seeded randomness says so, once per process."""
    policy = load_policy(node_config)
    if policy.randomness is Randomness.SEEDED:
        warn_seeded()  # the risk is the operator's to see
    check_ledger(policy)
    return policy


def init(policy: NodePolicy) -> str:
    """Give the policy's ledger an id (made if missing, entries kept) and record it beside the
    policy file; returns the id. ``LedgerError`` where one is recorded already or there is no
    policy file."""
    if policy.policy_file is None:
        raise LedgerError("init needs the node's policy in a policy file: its ledger's id is recorded beside it")
    if recorded_id(policy) is not None:
        raise LedgerError(f"the ledger in {policy.state_dir} is initialised already; "
                          "if its ledger.json is lost, restore it from its backup")
    with LedgerStore(policy.ledger_path).transaction(policy.budget, policy.accountant) as ledger:
        ledger.ledger_id = ledger.ledger_id or secrets.token_hex(16)  # kept: an init that crashed before its record
        ledger_id = ledger.ledger_id
    path = ids_path(policy.policy_file)
    ids = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    write_json_atomic(path, {**ids, str(policy.state_dir): ledger_id})
    return ledger_id


def init_nodes(policy_file: Path, partition_ids: Iterable[int]) -> None:
    """``init`` the ledger of each partition that was never initialised (the simulations and the
    deployment command, as their nodes' operator); a lost ledger stays lost."""
    for partition in partition_ids:
        policy = load_policy({"policy": str(policy_file), "partition-id": partition}, environ={})
        if recorded_id(policy) is None:
            init(policy)
