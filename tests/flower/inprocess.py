"""An in-process federation for tests: a Grid that hands each message to one of the project's
real ClientApps (by default ``clients.client_app.app``) with a per-node Context, and can lose replies,
duplicate them, or "kill" the server mid-round (raise after delivering).

Each node's policy is in its ``node_config`` (what a SuperNode's ``--node-config`` holds),
with an empty policy file beside which its ledger's id is recorded (``initialised``); its
durable ledger lives in the state folder named there, so a node restarted with a new
Context keeps it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients.client_app import app as dpsgd_app
from fedpriv.certificates import write_consortium
from fedpriv.federation.policy import load_policy
from fedpriv.node import init, recorded_id
from fedpriv.privacy import PrivacyLedger
from tests.flower.metadata import set_metadata


class ServerKilled(Exception):
    """The test killed the ServerApp mid-round."""


def node_config(partition: int, num_partitions: int, state: Path, **policy: Any) -> dict[str, Any]:
    """``--node-config`` of a node with its own state folder and policy keys."""
    return initialised({"partition-id": partition, "num-partitions": num_partitions,
                        "state-dir": str(state / f"node{partition}"), **policy})


def initialised(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` naming an (empty) policy file in its state folder, its ledger initialised
    there as its operator would (``python -m fedpriv.node init``) unless it was already."""
    policy_file = Path(str(config["state-dir"])) / "policy.toml"
    if not policy_file.exists():
        policy_file.parent.mkdir(parents=True, exist_ok=True)
        policy_file.write_text("")
    config = {**config, "policy": str(policy_file)}
    policy = load_policy(config, environ={})
    if recorded_id(policy) is None:
        init(policy)
    return config


def consortium(folder: Path, partitions: int) -> list[dict[str, str]]:
    """The policy keys of ``partitions`` nodes of one consortium: its CA (made in ``folder``
    once) and each node's identity certified by it (``fedpriv.certificates``)."""
    ca = write_consortium(folder, [f"node{i}" for i in range(partitions)])
    return [{"secagg-ca": str(ca), "secagg-identity": str(folder / f"node{i}")} for i in range(partitions)]


def booked(state_dir: Path) -> dict[str, dict]:
    """Client → its entries in the ledger in ``state_dir`` (none: nothing was booked)."""
    ledger = PrivacyLedger.load(state_dir / "ledger.json")
    return {client: ledger.entries(client) for client in ledger.clients()}


class InProcessGrid:
    """A Grid over in-process nodes; ``lose(node, message)`` drops a reply, ``kill_after``
    raises ``ServerKilled`` once that many messages have been delivered."""

    def __init__(self, run_config: dict[str, Any], node_configs: dict[int, dict[str, Any]], run_id: int = 1,
                 client_app: ClientApp = dpsgd_app) -> None:
        self.client_app = client_app
        self.run_config = run_config
        self.node_configs = node_configs
        self.run_id = run_id
        self.contexts = {node: self._context(node) for node in node_configs}
        self.lose: Callable[[int, Message], bool] = lambda node, message: False
        self.kill_after: int | None = None
        self.delivered = 0
        self.log: list[Message] = []  # every reply delivered back to the server

    def _context(self, node: int) -> Context:
        return Context(run_id=self.run_id, node_id=node, node_config=dict(self.node_configs[node]),
                       state=RecordDict(), run_config=dict(self.run_config))

    def restart(self, node: int) -> None:
        """A SuperNode restart: a fresh Context (in-memory state lost; its files kept)."""
        self.contexts[node] = self._context(node)

    def get_node_ids(self) -> list[int]:
        return sorted(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            set_metadata(message, message_id=uuid.uuid4().hex)
            ids.append(message.metadata.message_id)
        return ids

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        self.push_messages(messages)
        replies = []
        for message in messages:
            if self.kill_after is not None and self.delivered >= self.kill_after:
                raise ServerKilled(f"killed after {self.delivered} messages")
            node = message.metadata.dst_node_id
            set_metadata(message, src_node_id=0)
            reply = self.client_app(message, self.contexts[node])
            set_metadata(reply, src_node_id=node)
            self.delivered += 1
            if not self.lose(node, message):
                replies.append(reply)
        self.log.extend(replies)
        return replies
