"""server.exchange.send_and_receive against a deployed Grid (Flower's HttpGrid) whose transport is
replaced by nodes that answer after set delays."""

import time
import uuid

import pytest
from flwr.app import Message, MessageType, RecordDict
from flwr.superlink.grid import HttpGrid

from server.exchange import PULL_INTERVAL_S, send_and_receive
from tests.flower.metadata import set_metadata
from tests.timeouts import scaled

pytestmark = pytest.mark.usefixtures("task_identity")


class DelayedGrid(HttpGrid):
    """Node n answers ``delays[n]`` seconds after the push (None: never); counts pulls. No
    connection: HttpGrid's own ``__init__`` is not run."""

    def __init__(self, delays: dict[int, float | None]) -> None:  # pylint: disable=super-init-not-called
        self.delays = delays
        self.pending: list[tuple[float, Message]] = []
        self.pulls = 0

    def push_messages(self, messages):
        ids = []
        for message in messages:
            set_metadata(message, message_id=uuid.uuid4().hex)
            ids.append(message.metadata.message_id)
            delay = self.delays[message.metadata.dst_node_id]
            if delay is not None:
                reply = Message(RecordDict(), reply_to=message)
                set_metadata(reply, src_node_id=message.metadata.dst_node_id)
                self.pending.append((time.monotonic() + delay, reply))
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        now, wanted = time.monotonic(), set(message_ids)
        ready = [r for t, r in self.pending if t <= now and r.metadata.reply_to_message_id in wanted]
        self.pending = [(t, r) for t, r in self.pending if r not in ready]
        return ready


def _messages(nodes):
    return [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]


def test_returns_as_soon_as_the_last_reply_arrives():
    # Prepare: three nodes answering within 0.5 s (Flower's deployed Grid pulls every 3 s)
    grid = DelayedGrid({1: 0.0, 2: 0.2, 3: 0.5})
    # Execute
    start = time.monotonic()
    replies = send_and_receive(grid, _messages([1, 2, 3]))
    elapsed = time.monotonic() - start
    # Assert: every reply, once, collected within one pull interval of the last one (and a
    # scheduling slack through the timeout scale: a busy machine runs the loop late)
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2, 3]
    assert 0.5 <= elapsed < 0.5 + PULL_INTERVAL_S + scaled(0.4)
    assert grid.pulls >= 3


def test_a_silent_node_costs_the_timeout_and_the_others_replies_are_kept():
    # Prepare: node 2 never answers
    grid = DelayedGrid({1: 0.1, 2: None})
    # Execute
    start = time.monotonic()
    replies = send_and_receive(grid, _messages([1, 2]), timeout=0.6)
    elapsed = time.monotonic() - start
    # Assert
    assert [r.metadata.src_node_id for r in replies] == [1]
    assert 0.6 <= elapsed < 0.6 + PULL_INTERVAL_S + scaled(0.3)


def test_no_messages_means_no_pull():
    grid = DelayedGrid({})
    assert send_and_receive(grid, [], timeout=5) == [] and grid.pulls == 0
