"""The curious server makes an answer fail: the text that reaches it must not carry the
node's data. After booking, an error's own text can hold the exact size of the node's data
(a shape error names the batch: the whole test share), which the ledger covers only by a
noisy count; so a node sends a fixed reason and logs the details. Flower would send any
exception's text, so none may leave the app."""

import math
import re

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from clients.classic import algorithms as classic_algorithms
from clients.classic import client_app as classic_app
from clients.client_app import app
from fedpriv.federation import protocol
from fedpriv.models import build_model
from fedpriv.privacy import PrivacyLedger
from fedpriv.privacy.events import LaplaceEvent
from fedpriv.training import TrainingPlan
from server.classic.loops import Shares, _ask
from tests.conftest import SHARED_DATA
from tests.flower.inprocess import InProcessGrid, initialised, node_config
from tests.flower.metadata import set_metadata

pytestmark = pytest.mark.usefixtures("task_identity")

N_TRAIN, N_TEST = 87, 81  # partition 0 of 2 of the first 174 training and 162 test examples
RUN_CONFIG = {"limit-train": 2 * N_TRAIN, "limit-test": 2 * N_TEST}
POLICY = {"epsilon-budget": math.inf, "allow-evaluate": True, "public-num-examples": True}


def _context(state, run_config=RUN_CONFIG):
    node_config = initialised({"partition-id": 0, "num-partitions": 2, "state-dir": str(state),
                               "data-dir": str(SHARED_DATA), **POLICY})
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(), run_config=dict(run_config))


def _what_the_server_reads(context, content, message_type) -> tuple[int | None, str]:
    """(error code, reason) as Flower delivers them: the app's ``Error``, or, where the app
    raises, Flower's own (``run_clientapp``: the exception's type and text)."""
    message = Message(content, dst_node_id=5, message_type=message_type)
    set_metadata(message, message_id="m")
    try:
        reply = app(message, context)
    except Exception as err:  # noqa: BLE001 - as Flower's run_clientapp catches it
        return None, str(type(err)) + ":<'" + str(err) + "'>"
    assert reply.has_error()
    return reply.error.code, reply.error.reason


def _numbers(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"\d+", text)}


@pytest.mark.parametrize("message_type", [MessageType.EVALUATE, MessageType.TRAIN])
def test_a_release_failing_after_booking_sends_no_data_size(tmp_path, caplog, monkeypatch, message_type):
    # The node books, then its computation fails on the node's batch, whose size (the whole
    # test share when evaluating) the error names. (A model for another data set used to be
    # such a failure; it is now refused before booking: tests/flower/test_malicious_server.py.)
    def failing(model, features, labels, *args, **kwargs):
        raise RuntimeError(f"a batch of {len(labels)} examples does not fit the model's channels")

    monkeypatch.setattr("clients.evaluation.noisy_evaluation" if message_type == MessageType.EVALUATE
                        else "clients.task.train_round", failing)
    model = build_model("cnn", 0)
    if message_type == MessageType.EVALUATE:
        config = {protocol.MODEL: "cnn"}
    else:
        config = protocol.plan_config(TrainingPlan(model="cnn", lot_size=N_TRAIN, max_grad_norm=1.0,
                                                   noise_multiplier=1.0, lr=0.1))
    content = RecordDict({protocol.ARRAYS: ArrayRecord(model.state_dict()),
                          protocol.CONFIG: ConfigRecord({**config, protocol.SERVER_ROUND: 1,
                                                         protocol.RUN_KEY: "run-a"})})
    code, reason = _what_the_server_reads(_context(tmp_path), content, message_type)
    assert not _numbers(reason) & {N_TRAIN, N_TEST}, reason
    assert code == protocol.FAILURE_CODE and reason == protocol.FAILED_AFTER_BOOKING
    assert len(PrivacyLedger.load(tmp_path / "ledger.json").entries("0")) == 1  # booked: an over-charge only
    assert "channels" in caplog.text  # the details stay in the node's log


def test_an_unexpected_error_before_booking_sends_a_fixed_text(tmp_path, monkeypatch):
    # Reading the node's data fails with an OS error, whose text names the node's folder.
    def failing_read(*args, **kwargs):
        raise OSError(f"[Errno 5] Input/output error: '{SHARED_DATA}/MNIST/raw/train-images-idx3-ubyte'")

    monkeypatch.setattr("clients.task.load_dataset", failing_read)
    context = _context(tmp_path, {"limit-train": 176})  # a size no earlier test read (the node caches its data)
    code, reason = _what_the_server_reads(context, RecordDict({protocol.CONFIG: ConfigRecord()}), MessageType.QUERY)
    assert str(SHARED_DATA) not in reason, reason
    assert code == protocol.FAILURE_CODE and reason == protocol.FAILED


def test_a_classic_release_failing_after_booking_sends_no_share_size(tmp_path, monkeypatch, caplog):
    # A release that fails on the node's records (here a kind that names their number, as a
    # shape error would) after booking: the server gets the fixed text, the node's log the rest.
    real = classic_algorithms.RELEASES["kmeans-moments"]

    def failing(params, node, rng):
        x, _ = params.share.records(node)
        raise ValueError(f"records must have shape (n, 5), got {x.shape}")

    monkeypatch.setitem(classic_algorithms.RELEASES, "kmeans-moments",
                        classic_algorithms.Algorithm(real.parse, failing))
    nodes = {i: node_config(i, 3, tmp_path, **{"epsilon-budget": 10.0}) for i in range(3)}
    grid = InProcessGrid({}, nodes, client_app=classic_app.app)
    config = {"algorithm": "kmeans-moments", "dataset": "iris", "seed": 0, "epsilon": 1.0, "step": 0,
              "run-key": "run-a"}
    shares = Shares()
    _ask(grid, config, {"low": np.zeros(4), "high": np.full(4, 8.0)}, 9, LaplaceEvent(1.0), shares)
    assert not any("40" in reason for reason in shares.refused.values())  # iris: 120 training records, 40 a node
    assert set(shares.refused.values()) == {protocol.FAILED_AFTER_BOOKING}
    assert "(40, 4)" in caplog.text
