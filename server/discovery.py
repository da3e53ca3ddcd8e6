"""Before round 1: ask every connected node who it is and how many examples it holds.

The server needs each client's N to know (and, in target-ε mode, calibrate) the event
a round costs it, and a stable client id to key the ledger by (Flower node ids change
from run to run; partition ids do not). Nodes that do not answer are left out of the
run. The server first waits for ``min-clients`` nodes (the simulation commands set it to
``--clients``: Flower's engine registers its nodes while the ServerApp is already
running); nodes that connect later are described before the next round
(``describe_nodes``) and join it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from clients import protocol


@dataclass(frozen=True)
class ClientInfo:
    """A client as it described itself."""

    client_id: str
    num_examples: int


def discover(grid: Grid, min_nodes: int = 1, timeout: float = 600.0) -> dict[int, ClientInfo]:
    """Wait for ``min_nodes`` connected nodes, then ``describe_nodes`` all of them; two
    nodes with one client id is a misconfigured federation (an error)."""
    while len(node_ids := sorted(grid.get_node_ids())) < min_nodes:
        log(INFO, "Waiting for nodes: %d connected, %d needed", len(node_ids), min_nodes)
        time.sleep(1)
    found = describe_nodes(grid, node_ids, timeout)
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
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = reply.metadata.src_node_id
        if reply.has_error():
            log(WARNING, "Node %d did not describe itself: %s", node, reply.error.reason)
            continue
        info = reply.content.config_records[protocol.INFO]
        found[node] = ClientInfo(str(info[protocol.CLIENT_ID]), int(info[protocol.NUM_EXAMPLES]))
    log(INFO, "Discovered %d of %d nodes", len(found), len(node_ids))
    return found
