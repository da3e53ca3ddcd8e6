"""A one-pass delivery loop for Flower's simulation engine.

Flower's engine hands messages to its Ray actors from one thread
(``vce_api.add_messages_to_queue``): every 0.1 s it asks the in-memory LinkState for the
next message of each registered node, and each ask (``get_message_ins``) scans and
re-validates every stored message under the state's lock. A sweep is thus O(nodes ×
messages in flight): at 1,000 nodes, ~0.8 s with a round's 100 messages and 4–8 s with
discovery's 1,000 (measured on this machine, under load), so the loop keeps one of the driver's cores
busy for the whole run, beside the actors that train.

``one_pass_delivery`` swaps in a loop that does the same in one pass per sweep: Flower's
own check (expiry, federation) of each stored message once, then at most one undelivered
message per registered node, marked delivered, in the order they were pushed. It applies
only to Flower's ``InMemoryLinkState`` with the internals it uses (``supported``); any
other state keeps Flower's loop. Nothing a node sends or books changes: only how fast
messages reach the actors.
"""

from __future__ import annotations

import threading
from collections.abc import Container, Iterator
from contextlib import contextmanager
from queue import Queue

from flwr.app import Message
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate import InMemoryLinkState, LinkState
from flwr.supercore.date import now

SWEEP_INTERVAL_S = 0.1
"""Seconds between sweeps, as in Flower's loop."""

_FLOWER_LOOP = vce_api.add_messages_to_queue


def supported(state: LinkState) -> bool:
    """Whether ``state`` is the in-memory LinkState with the internals ``deliverable`` uses."""
    return isinstance(state, InMemoryLinkState) and all(
        hasattr(state, name) for name in ("lock", "message_ins_store", "_check_stored_messages"))


def deliverable(state: InMemoryLinkState, nodes: Container[int]) -> list[Message]:
    """One sweep: the first undelivered message of each node in ``nodes``, marked delivered
    (what Flower's loop takes with ``get_message_ins(node, limit=1)`` for every node)."""
    with state.lock:
        state._check_stored_messages(set(state.message_ins_store))  # drops expired messages
        taken: dict[int, Message] = {}
        for message in state.message_ins_store.values():
            node = message.metadata.dst_node_id
            if node in nodes and node not in taken and message.metadata.delivered_at == "":
                taken[node] = message
        delivered_at = now().isoformat()
        for message in taken.values():
            message.metadata.delivered_at = delivered_at
    return list(taken.values())


def _add_messages_to_queue(state: LinkState, queue: Queue[Message], nodes_mapping: dict[int, int],
                           f_stop: threading.Event) -> None:
    """``vce_api.add_messages_to_queue``'s contract, one pass per sweep."""
    if not supported(state):
        _FLOWER_LOOP(state, queue, nodes_mapping, f_stop)
        return
    while not f_stop.is_set():
        for message in deliverable(state, nodes_mapping):  # type: ignore[arg-type]
            queue.put(message)
        f_stop.wait(SWEEP_INTERVAL_S)


@contextmanager
def one_pass_delivery() -> Iterator[None]:
    """Within the block, Flower's simulation engine delivers with ``_add_messages_to_queue``."""
    vce_api.add_messages_to_queue = _add_messages_to_queue
    try:
        yield
    finally:
        vce_api.add_messages_to_queue = _FLOWER_LOOP
