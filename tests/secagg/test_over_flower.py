"""The secure sum over Flower messages: ``server.secure_sum`` drives ``clients.secure_sum``
in-process (``InProcessGrid``) with a tiny ClientApp whose vector is known; losing the
collect replies of 20 % of the nodes still gives the exact sum over the survivors, and the
collect message carries the caller's content to the node and its extra reply back."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from clients.secure_sum import answer_stage
from fedpriv.secagg import RECORD_KEY, Requirements, StageInfo, Vector
from server.secure_sum import secure_sum
from tests.flower.inprocess import InProcessGrid
from tests.flower.metadata import set_metadata
from tests.timeouts import scaled

pytestmark = pytest.mark.usefixtures("task_identity")
D, BITS = 500, 32
NODES = list(range(101, 111))
REQ = Requirements(min_cohort=8, min_survivors=7, max_colluders=1)
seen: dict[int, StageInfo] = {}


def known_vector(node: int) -> np.ndarray:
    return (np.arange(D, dtype=np.uint64) * node * 2_654_435_761 + node) % (1 << BITS)


def contribute(msg: Message, context: Context, info: StageInfo) -> tuple[Vector, RecordDict]:
    assert msg.content.config_records["plan"]["round"] == 3
    seen[context.node_id] = info
    return Vector(known_vector(context.node_id), {}), RecordDict({"booked": ConfigRecord({"node": context.node_id})})


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    try:
        return Message(answer_stage(msg, context, REQ, contribute), reply_to=msg)
    except ValueError as err:
        return Message(Error(code=1, reason=str(err)), reply_to=msg)


def stage_of(message: Message) -> str:
    return str(message.content.config_records[RECORD_KEY]["stage"])


def test_a_secure_sum_over_flower_survives_losing_20_percent_at_collect() -> None:
    grid = InProcessGrid({}, {node: {} for node in NODES}, client_app=app)
    killed = {103, 108}
    grid.lose = lambda node, message: node in killed and stage_of(message) == "collect"
    result = secure_sum(grid, NODES, dimension=D, modulus_bits=BITS, threshold=7,
                        collect_content=lambda node: RecordDict({"plan": ConfigRecord({"round": 3})}),
                        timeout=scaled(10.0), round_key="run/round-3")
    survivors = [n for n in NODES if n not in killed]
    assert result.reason is None and list(result.survivors) == survivors and set(result.dropped) == killed
    expected = [sum(int(known_vector(n)[i]) for n in survivors) % (1 << BITS) for i in range(D)]
    assert result.sum.tolist() == expected
    assert {n: r.config_records["booked"]["node"] for n, r in result.extras.items()} == {n: n for n in survivors}
    assert all(info.cohort_size == 10 and info.threshold == 7 and info.round_key == "run/round-3"
               for info in seen.values())
    assert all(result.bytes_sent[n] > D * 4 for n in survivors)


def test_a_node_that_refuses_is_dropped_and_too_few_left_discard_the_round() -> None:
    """Every node demands 7 survivors; with 4 of 10 collect replies lost (6 left, the server's
    threshold 6 met) the nodes refuse to unmask and the round is discarded."""
    grid = InProcessGrid({}, {node: {} for node in NODES}, client_app=app)
    grid.lose = lambda node, message: node <= 104 and stage_of(message) == "collect"
    result = secure_sum(grid, NODES, dimension=D, modulus_bits=BITS, threshold=6,
                        collect_content=lambda node: RecordDict({"plan": ConfigRecord({"round": 3})}),
                        timeout=scaled(10.0), round_key="run/round-4")
    assert result.sum is None and result.survivors == ()
    assert all("this node needs at least 7" in result.dropped[n] for n in range(105, 111))


class Meddling(InProcessGrid):
    """Hands back, with each collect batch, a copy of node 101's reply claiming to come from
    node 102 and a second copy from 101 (a forged and a duplicate reply)."""

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        if stage_of(messages[0]) == "collect":
            to_101 = next(m for m in messages if m.metadata.dst_node_id == 101)
            first = next(r for r in replies if r.metadata.src_node_id == 101)
            forged = set_metadata(Message(first.content, reply_to=to_101), src_node_id=102)
            duplicate = set_metadata(Message(RecordDict({RECORD_KEY: ConfigRecord({"masked": b"x"})}),
                                             reply_to=to_101), src_node_id=101)
            replies = [forged] + replies + [duplicate]
        return replies


def test_replies_that_answer_no_message_of_the_node_or_repeat_are_ignored() -> None:
    grid = Meddling({}, {node: {} for node in NODES}, client_app=app)
    result = secure_sum(grid, NODES, dimension=D, modulus_bits=BITS, threshold=7,
                        collect_content=lambda node: RecordDict({"plan": ConfigRecord({"round": 3})}),
                        timeout=scaled(10.0), round_key="run/round-5")
    assert result.reason is None and list(result.survivors) == NODES
    assert result.sum.tolist() == [sum(int(known_vector(n)[i]) for n in NODES) % (1 << BITS) for i in range(D)]
