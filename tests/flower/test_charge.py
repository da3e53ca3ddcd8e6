"""A round's charge is one value: made from the plan, checked against what the DP-SGD engine
would spend before anything is booked, booked by the node, sent, and compared by the server.

The attack is a plan whose stated cost is cheaper than its training (a bug in
``TrainingPlan.round_events``, or a tampered one): the node must refuse it explicitly, with
nothing booked, also under ``python -O``, which strips ``assert``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from fedpriv.federation import protocol
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import dpsgd_event
from fedpriv.training import TrainingPlan
from server.checks import check_train_reply
from tests.conftest import PROJECT_ROOT, SHARED_DATA
from tests.flower.metadata import set_metadata
from tests.timeouts import scaled

PLAN = TrainingPlan(model="mlp", lot_size=20, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.1)


def cheaper_charge_outcome(state: Path) -> dict:
    """Send TRAIN with a plan that under-states its cost (σ ten times the real one) to a
    fresh node in ``state``; what came back and what the node booked."""
    from clients.client_app import app
    from fedpriv.models import build_model
    from simulations._flower_private import set_task_identity
    from tests.flower.inprocess import booked, initialised

    set_task_identity(run_id=1, task_id=1, node_id=0)  # a process of its own, or the task_identity fixture's
    real = TrainingPlan.round_events

    def understated(plan: TrainingPlan, num_examples: int):
        return (dpsgd_event(10 * plan.noise_multiplier, plan.sample_rate(num_examples),
                            plan.steps_per_round(num_examples)),)

    TrainingPlan.round_events = understated  # type: ignore[method-assign]
    try:
        node = initialised({"partition-id": 0, "num-partitions": 2, "state-dir": str(state),
                            "data-dir": str(SHARED_DATA), "epsilon-budget": math.inf, "public-num-examples": True})
        context = Context(run_id=1, node_id=5, node_config=node, state=RecordDict(),
                          run_config={"limit-train": 100, "limit-test": 100})
        config = ConfigRecord({**protocol.plan_config(PLAN), protocol.SERVER_ROUND: 1, protocol.RUN_KEY: "run-a"})
        content = RecordDict({protocol.ARRAYS: ArrayRecord(build_model(PLAN.model, 0).state_dict()),
                              protocol.CONFIG: config})
        message = Message(content, dst_node_id=5, message_type=MessageType.TRAIN)
        set_metadata(message, message_id="m")
        reply = app(message, context)
    finally:
        TrainingPlan.round_events = real  # type: ignore[method-assign]
    return {"error": reply.has_error(), "code": reply.error.code if reply.has_error() else None,
            "reason": reply.error.reason if reply.has_error() else "", "booked": booked(state)}


def _check_refused(outcome: dict) -> None:
    assert outcome["error"] and outcome["code"] == protocol.REFUSAL_CODE, outcome
    assert "the DP-SGD engine spends" in outcome["reason"] and "not the charged" in outcome["reason"]
    assert outcome["booked"] == {}


@pytest.mark.usefixtures("task_identity")
def test_a_plan_cheaper_than_its_training_is_refused_before_booking(tmp_path):
    _check_refused(cheaper_charge_outcome(tmp_path / "node"))


def test_the_refusal_does_not_rest_on_assert_python_O_keeps_it(tmp_path):
    code = ("import json, sys; from pathlib import Path; from tests.flower.test_charge import cheaper_charge_outcome; "
            "assert False, 'asserts are on'"  # fails loudly if -O did not take effect
            )
    probe = subprocess.run([sys.executable, "-O", "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, timeout=scaled(120))
    assert probe.returncode == 0, probe.stderr  # the assert above was stripped: -O is in force
    run = ("import json, sys; from pathlib import Path; from tests.flower.test_charge import cheaper_charge_outcome; "
           "print(json.dumps(cheaper_charge_outcome(Path(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-O", "-c", run, str(tmp_path / "node")], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
                          timeout=scaled(300))
    assert done.returncode == 0, done.stderr
    _check_refused(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.usefixtures("task_identity")
def test_the_server_rejects_a_reply_charged_under_another_entry_or_events():
    charge = Charge(protocol.train_entry("run-a", 1), PLAN.round_events(50))
    arrays = ArrayRecord()  # the charge is checked before the arrays
    for reported in (Charge(protocol.train_entry("run-a", 2), charge.events),
                     Charge(charge.entry, (dpsgd_event(10.0, 0.4, 3),))):
        reply = Message(RecordDict({protocol.ARRAYS: arrays, protocol.PRIVACY: protocol.charge_record(reported)}),
                        dst_node_id=5, message_type=MessageType.TRAIN)
        assert "differs from the booked" in (check_train_reply(reply, charge, arrays, 1.0) or "")
