"""simulations._delivery hands the simulation engine's actors exactly what Flower's own loop
would: per sweep, the first undelivered message of each registered node, marked delivered,
expired ones dropped; and it leaves Flower's loop in place for any other LinkState."""

import threading
import time
from queue import Queue

import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.task_pb2 import Task
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from simulations import _delivery
from tests.timeouts import scaled


@pytest.fixture(autouse=True)
def superlink_identity(task_identity):
    """Messages pushed as the server's (the SuperLink's node id), as in a simulation."""
    from simulations._flower_private import set_task_identity

    set_task_identity(run_id=1, task_id=1, node_id=SUPERLINK_NODE_ID)  # restored by task_identity


def _federation(num_nodes):
    """A fresh in-memory LinkState with a run and ``num_nodes`` registered nodes, as the
    simulation engine makes them; its grid; node id -> partition id."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    run = Run.create_empty(run_id=1)
    run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
    state = factory.state()
    state.run_ids[1] = RunRecord(run=run)
    state.task_store[1] = Task(task_id=1, run_id=1)
    nodes = vce_api._register_nodes(num_nodes, factory)
    grid = InMemoryGrid(factory)
    grid.set_run(run)
    return state, grid, nodes


def _push(grid, node, tag, ttl=None):
    message = Message(RecordDict({"config": ConfigRecord({"tag": tag})}), dst_node_id=node,
                      message_type=MessageType.QUERY, ttl=ttl)
    (message_id,) = grid.push_messages([message])
    return message_id


def _tags(messages):
    """Which messages, by tag (node ids are drawn anew for each federation)."""
    return sorted(m.content.config_records["config"]["tag"] for m in messages)


def _flower_sweep(state, nodes):
    """What Flower's loop takes in one sweep."""
    return [m for node in nodes for m in state.get_message_ins(node_id=node, limit=1)]


def test_flowers_in_memory_state_is_supported():
    state, _, _ = _federation(1)
    assert _delivery.supported(state)  # fails on a Flower whose internals moved: look before upgrading


def test_each_sweep_delivers_what_flowers_loop_delivers():
    sweeps = {}
    for name, sweep in (("flower", _flower_sweep), ("one pass", _delivery.deliverable)):
        state, grid, nodes = _federation(5)
        a, b, c, d, _ = list(nodes)
        for node, tag in ((a, "a1"), (b, "b"), (a, "a2"), (c, "c")):
            _push(grid, node, tag)
        expired = _push(grid, d, "d", ttl=0.01)
        time.sleep(0.05)
        taken = [sweep(state, nodes) for _ in range(3)]
        assert all(m.metadata.delivered_at != "" for s in taken for m in s)
        assert expired not in state.message_ins_store  # dropped by Flower's own check, never delivered
        sweeps[name] = [_tags(s) for s in taken]
    assert sweeps["one pass"] == sweeps["flower"]
    assert sweeps["one pass"] == [["a1", "b", "c"], ["a2"], []]  # one message per node per sweep


def test_nodes_outside_the_mapping_get_nothing():
    state, grid, nodes = _federation(3)
    first, *others = list(nodes)
    for node in nodes:
        _push(grid, node, str(nodes[node]))
    assert [m.metadata.dst_node_id for m in _delivery.deliverable(state, set(others))] == others
    assert state.message_ins_store[next(iter(state.message_ins_store))].metadata.delivered_at == ""


def test_the_loop_feeds_the_queue_until_stopped():
    state, grid, nodes = _federation(4)
    queue, stop = Queue(), threading.Event()
    loop = threading.Thread(target=_delivery._add_messages_to_queue, args=(state, queue, nodes, stop))
    loop.start()
    try:
        for node in nodes:
            _push(grid, node, str(nodes[node]))
        got = [queue.get(timeout=scaled(5)) for _ in nodes]
    finally:
        stop.set()
        loop.join(timeout=scaled(5))
    assert not loop.is_alive() and queue.empty()
    assert sorted(m.metadata.dst_node_id for m in got) == sorted(nodes)


def test_another_state_keeps_flowers_loop(monkeypatch):
    calls = []
    monkeypatch.setattr(_delivery, "_FLOWER_LOOP", lambda *args: calls.append(args))
    other = object()
    _delivery._add_messages_to_queue(other, Queue(), {1: 0}, threading.Event())
    assert len(calls) == 1 and calls[0][0] is other


def test_the_engine_gets_its_own_loop_back():
    flower = vce_api.add_messages_to_queue
    with pytest.raises(RuntimeError):
        with _delivery.one_pass_delivery():
            assert vce_api.add_messages_to_queue is _delivery._add_messages_to_queue
            raise RuntimeError("the simulation failed")
    assert vce_api.add_messages_to_queue is flower
    assert SUPERLINK_NODE_ID not in _federation(2)[2]  # the server is no node to deliver to
