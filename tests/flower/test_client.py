"""The ClientApp's train handler in-process: it trains, books its own events, and refuses
rounds that its *own* ledger cannot afford (or has already trained), without training."""

import dataclasses

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from clients import protocol
from clients.client_app import app
from fedpriv.models import build_model
from fedpriv.privacy import epsilon_of
from fedpriv.privacy.events import ComposedEvent
from fedpriv.training import default_plan

pytestmark = pytest.mark.usefixtures("task_identity")

PLAN = dataclasses.replace(default_plan("mnist"), lot_size=50, noise_multiplier=1.5)
N = 100  # partition 0 of 2 of the first 200 examples
ONE = PLAN.round_events(N)


def _message(round_: int, plan=PLAN) -> Message:
    config = ConfigRecord({**protocol.plan_config(plan), protocol.SERVER_ROUND: round_})
    arrays = ArrayRecord(build_model(plan.model, 0).state_dict())
    return Message(RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: config}),
                   dst_node_id=5, message_type=MessageType.TRAIN)


@pytest.fixture
def context(shared_data_dir):
    one, two = epsilon_of(ComposedEvent(ONE), 1e-5), epsilon_of(ComposedEvent(ONE * 2), 1e-5)
    run_config = {"limit-train": 200, "data-dir": str(shared_data_dir), "client-epsilon-budget": (one + two) / 2}
    return Context(run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 2},
                   state=RecordDict(), run_config=run_config)


def test_trains_then_refuses_over_its_own_budget(context):
    reply = app(_message(1), context)
    assert not reply.has_error()
    assert protocol.read_events(reply.content.config_records[protocol.PRIVACY]) == ONE
    assert reply.content.metric_records[protocol.METRICS][protocol.NUM_EXAMPLES] > 0

    refusal = app(_message(2), context)  # a second round would exceed the client's budget
    assert refusal.has_error() and refusal.error.code == protocol.REFUSAL_CODE
    assert "budget" in refusal.error.reason

    replay = app(_message(1, dataclasses.replace(PLAN, noise_multiplier=50.0)), context)
    assert replay.has_error() and replay.error.code == protocol.REFUSAL_CODE
