"""δ against the data it protects: (ε, δ)-DP with δ ≥ 1/N allows publishing a record
outright, so a node refuses it (δ the effective one: its policy's, tightened by the run's)
and logs a warning when δ > 1/(10·N). N is what the node has already released (its public
N, or its DP count: the check is post-processing) or, in the classic app, the size of its
share of a public data set."""

import logging
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from clients.classic import client_app as classic_app
from clients.client_app import app
from clients.task import local_data
from fedpriv.federation import protocol
from fedpriv.federation.settings import RunSettings
from fedpriv.models import build_model
from fedpriv.privacy import PrivacyLedger
from fedpriv.privacy.events import LaplaceEvent
from fedpriv.training import TrainingPlan
from server.classic.loops import Shares, _ask
from tests.conftest import SHARED_DATA
from tests.flower.inprocess import InProcessGrid, booked, initialised, node_config
from tests.flower.metadata import set_metadata

pytestmark = pytest.mark.usefixtures("task_identity")

def _size() -> int:
    """N: partition 0 of 2 of the first 100 training examples, under the default partition-key
    (read in the test: collecting the tests reads no data)."""
    return len(local_data(RunSettings.from_run_config({"limit-train": 100}), {"partition-id": 0, "num-partitions": 2},
                          SHARED_DATA, partition_key=0).labels)
PLAN = TrainingPlan(model="mlp", lot_size=10, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.1)


def _context(state, run_config=None, **policy):
    node_config = initialised({"partition-id": 0, "num-partitions": 2, "state-dir": str(state),
                               "data-dir": str(SHARED_DATA), "epsilon-budget": math.inf, "allow-evaluate": True,
                               **policy})
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                   run_config={"limit-train": 100, "limit-test": 100, **(run_config or {})})


def _send(context, message_type, server_round=1):
    arrays = ArrayRecord(build_model("mlp", 0).state_dict())
    config = {protocol.SERVER_ROUND: server_round, protocol.RUN_KEY: "run-a"}
    config.update(protocol.plan_config(PLAN) if message_type == MessageType.TRAIN else {protocol.MODEL: "mlp"})
    content = RecordDict({protocol.CONFIG: ConfigRecord(config)} if message_type == MessageType.QUERY else
                         {protocol.ARRAYS: arrays, protocol.CONFIG: ConfigRecord(config)})
    message = Message(content, dst_node_id=5, message_type=message_type)
    set_metadata(message, message_id="m")
    return app(message, context)


def _entries(state) -> dict:
    path = state / "ledger.json"
    return PrivacyLedger.load(path).entries("0") if path.exists() else {}


MESSAGES = [MessageType.QUERY, MessageType.TRAIN, MessageType.EVALUATE]


@pytest.mark.parametrize("one_over_n", [False, True])
def test_a_delta_of_at_least_one_over_n_is_refused_before_booking(tmp_path, one_over_n):
    delta = 1 / _size() if one_over_n else 0.5
    context = _context(tmp_path, {"delta": delta}, delta=delta, **{"public-num-examples": True})
    for message_type in MESSAGES:
        reply = _send(context, message_type)
        assert reply.has_error() and reply.error.code == protocol.REFUSAL_CODE
        assert "delta" in reply.error.reason and str(_size()) not in reply.error.reason
    assert not _entries(tmp_path)


@pytest.mark.parametrize("policy_delta, run_delta", [(0.5, None), (1e-5, 0.5)])
def test_the_check_is_on_the_effective_delta(tmp_path, policy_delta, run_delta):
    # the smaller of the policy's δ and the run's (default 1e-5) is this run's guarantee
    context = _context(tmp_path, None if run_delta is None else {"delta": run_delta}, delta=policy_delta,
                       **{"public-num-examples": True})
    for message_type in MESSAGES:
        assert not _send(context, message_type).has_error()


def test_a_private_n_is_checked_as_released(tmp_path):
    # N private: QUERY books the node's DP count, then refuses on it (post-processing: the
    # refusal reveals nothing the count did not); TRAIN and EVALUATE refuse without booking.
    context = _context(tmp_path, {"delta": 0.5}, delta=0.5, **{"num-examples-noise": 1.0})
    for message_type in MESSAGES:
        reply = _send(context, message_type)
        assert reply.has_error() and "delta" in reply.error.reason
    entries = _entries(tmp_path)
    assert len(entries) == 1 and next(iter(entries)).startswith("release/num-examples/")


def test_a_delta_above_a_tenth_of_one_over_n_is_answered_with_a_warning(tmp_path, caplog):
    context = _context(tmp_path, {"delta": 0.01}, delta=0.01, **{"public-num-examples": True})  # 1/500 < 0.01 < 1/50
    with caplog.at_level(logging.WARNING, logger="clients.delta"):
        replies = [_send(context, message_type) for message_type in MESSAGES]
    assert not any(reply.has_error() for reply in replies)
    assert caplog.text.count("delta = 0.01 exceeds 1/(10 N)") == 3
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="clients.delta"):
        assert not _send(_context(tmp_path / "small", {"delta": 1e-3}, delta=1e-3, **{"public-num-examples": True}),
                         MessageType.QUERY).has_error()
    assert "exceeds" not in caplog.text  # 1e-3 < 1/500


@pytest.mark.parametrize("delta, refused", [(1 / 40, True), (0.02, False)])
def test_a_classic_node_checks_delta_against_its_share(tmp_path, caplog, delta, refused):
    # iris: 120 training records, 40 on each of 3 nodes (a public size: no record is read)
    nodes = {i: node_config(i, 3, tmp_path, **{"epsilon-budget": 10.0, "delta": delta}) for i in range(3)}
    grid = InProcessGrid({}, nodes, client_app=classic_app.app)
    config = {"algorithm": "kmeans-moments", "dataset": "iris", "seed": 0, "epsilon": 1.0, "step": 0,
              "run-key": "run-a"}
    shares = Shares()
    with caplog.at_level(logging.WARNING, logger="clients.delta"):
        _ask(grid, config, {"low": np.zeros(4), "high": np.full(4, 8.0)}, 9, LaplaceEvent(1.0), shares)
    if refused:
        assert len(shares.refused) == 3 and all("delta" in reason for reason in shares.refused.values())
        assert not any(booked(tmp_path / f"node{i}") for i in range(3))
    else:
        assert all(not reply.has_error() for reply in grid.log) and "exceeds 1/(10 N)" in caplog.text
