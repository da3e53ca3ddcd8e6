"""Before round 1: ask every connected node who it is and how many examples it holds.

The server needs each client's N to know (and, in target-ε mode, calibrate) the event
a round costs it, and a stable client id to key the ledger by (Flower node ids change
from run to run; partition ids do not). The N it gets is what the node chose to release:
a DP count, with the ledger entries that paid for it, or the exact N where the node's
policy declares it public. Nodes that do not answer, or answer malformed, are left out of
the run. The server first waits for ``min-clients`` nodes (the simulation commands set it to
``--clients``: Flower's engine registers its nodes while the ServerApp is already
running); nodes that connect later are described before the next round
(``describe_nodes``) and join it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedpriv.federation import protocol
from fedpriv.privacy.events import DpEvent
from server.exchange import send_and_receive

_CLIENT_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class ClientInfo:
    """A client as it described itself: its released N, the entries that paid for that
    release, and the events of one EVALUATE answer (none: it does not evaluate)."""

    client_id: str
    num_examples: int
    public: bool = True
    releases: Mapping[str, tuple[DpEvent, ...]] = field(default_factory=dict)
    evaluate_events: tuple[DpEvent, ...] = ()


def read_description(content: RecordDict) -> ClientInfo:
    """A QUERY reply's ClientInfo; ``ProtocolError`` for anything malformed."""
    try:
        info = content.config_records[protocol.INFO]
        client, n = info[protocol.CLIENT_ID], info[protocol.NUM_EXAMPLES]
        public = info[protocol.NUM_EXAMPLES_PUBLIC]
        releases, evaluate_events = protocol.read_releases(content.config_records[protocol.PRIVACY])
    except KeyError as err:
        raise protocol.ProtocolError(f"description lacks {err}") from None
    if not isinstance(client, str) or not _CLIENT_ID.fullmatch(client):
        raise protocol.ProtocolError(f"bad client id {client!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise protocol.ProtocolError(f"bad num-examples {n!r}")
    if not isinstance(public, bool):
        raise protocol.ProtocolError(f"bad num-examples-public {public!r}")
    return ClientInfo(client, n, public, releases, evaluate_events)


def wait_for_nodes(grid: Grid, min_nodes: int) -> list[int]:
    """The connected node ids, once there are at least ``min_nodes`` (Flower's simulation
    engine registers its nodes while the ServerApp already runs: asking at once can find none)."""
    while len(node_ids := sorted(grid.get_node_ids())) < min_nodes:
        log(INFO, "Waiting for nodes: %d connected, %d needed", len(node_ids), min_nodes)
        time.sleep(0.5)
    return node_ids


def discover(grid: Grid, min_nodes: int = 1, timeout: float = 600.0) -> dict[int, ClientInfo]:
    """Wait for ``min_nodes`` connected nodes, then ``describe_nodes`` all of them; two
    nodes with one client id is a misconfigured federation (an error)."""
    start = time.perf_counter()
    node_ids = wait_for_nodes(grid, min_nodes)
    connected = time.perf_counter()
    found = describe_nodes(grid, node_ids, timeout)
    log(INFO, "Discovery: %d nodes connected after %.1f s, described in %.1f s", len(node_ids),
        connected - start, time.perf_counter() - connected)
    ids = [c.client_id for c in found.values()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two nodes claim the same client id: {sorted(ids)}")
    return found


def describe_nodes(grid: Grid, node_ids: list[int], timeout: float) -> dict[int, ClientInfo]:
    """Node id → ClientInfo for every node in ``node_ids`` that answered the QUERY message."""
    messages = [
        Message(RecordDict({protocol.CONFIG: ConfigRecord()}), dst_node_id=node,
                message_type=MessageType.QUERY)
        for node in node_ids
    ]
    found: dict[int, ClientInfo] = {}
    for reply in send_and_receive(grid, messages, timeout):
        node = reply.metadata.src_node_id
        if reply.has_error():
            log(WARNING, "Node %d did not describe itself: %s", node, reply.error.reason)
            continue
        try:
            found[node] = read_description(reply.content)
        except protocol.ProtocolError as err:
            log(WARNING, "Node %d described itself badly: %s", node, err)
    log(INFO, "Discovered %d of %d nodes", len(found), len(node_ids))
    return found
