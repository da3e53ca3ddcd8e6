"""The curious server against the real ClientApp, in process: each test is an attack that
worked on an earlier fedpriv and must now fail (docs/threat-model.md lists them)."""

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from scipy import stats

from clients.client_app import app
from clients.task import local_data
from fedpriv.dpsgd import train_dpsgd
from fedpriv.dpsgd.memory import measure_step_memory
from fedpriv.federation import protocol
from fedpriv.federation.policy import LOSS_CLIP
from fedpriv.federation.settings import RunSettings
from fedpriv.models import build_model
from fedpriv.privacy import GaussianEvent, PrivacyLedger, epsilon_of
from fedpriv.privacy.charge import Charge
from fedpriv.privacy.events import ComposedEvent
from fedpriv.training import TrainingPlan, train_round
from fedpriv.training import local as training
from server.checks import check_train_reply, update_norm_bound
from tests.conftest import SHARED_DATA
from tests.flower.inprocess import booked, initialised
from tests.flower.metadata import set_metadata

pytestmark = pytest.mark.usefixtures("task_identity")

@functools.cache
def _size() -> int:
    """N: partition 0 of 2 of the first 200 training examples, under the default partition-key
    (read on first use: collecting the tests reads no data)."""
    return len(local_data(RunSettings.from_run_config({"limit-train": 200}), {"partition-id": 0, "num-partitions": 2},
                          SHARED_DATA, partition_key=0).labels)


def _plan() -> TrainingPlan:
    """q = 1 and one plain SGD step: the update is exactly -lr (S + σC z) / N, S the clipped sum."""
    return TrainingPlan(model="cnn", lot_size=_size(), max_grad_norm=1.0, noise_multiplier=1.0, lr=1.0, momentum=0.0)


def _one_round():
    return _plan().round_events(_size())


@pytest.fixture
def run_config(shared_data_dir):
    """No data-dir: the nodes read their data from their own policy's."""
    return {"limit-train": 200, "limit-test": 200}


def _context(run_config, state, run_id=1, data_dir=SHARED_DATA, **policy):
    node_config = initialised({"partition-id": 0, "num-partitions": 2, "state-dir": str(state),
                               "data-dir": str(data_dir), **policy})
    return Context(run_id=run_id, node_id=5, node_config=node_config, state=RecordDict(), run_config=dict(run_config))


def _send(context, content, message_type):
    message = Message(content, dst_node_id=5, message_type=message_type)
    set_metadata(message, message_id="m")
    return app(message, context)


def _train(context, run_key="run-a", server_round=1, plan=None, arrays=None):
    plan = plan or _plan()
    config = ConfigRecord({**protocol.plan_config(plan), protocol.SERVER_ROUND: server_round,
                           protocol.RUN_KEY: run_key})
    arrays = arrays or ArrayRecord(build_model(plan.model, 0).state_dict())
    return _send(context, RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: config}), MessageType.TRAIN)


def _query(context):
    return _send(context, RecordDict({protocol.CONFIG: ConfigRecord()}), MessageType.QUERY)


def _vector(reply_or_model) -> np.ndarray:
    if isinstance(reply_or_model, Message):
        state = reply_or_model.content.array_records[protocol.ARRAYS].to_torch_state_dict()
    else:
        state = reply_or_model.state_dict()
    return torch.cat([t.flatten().double() for t in state.values()]).numpy()


def _update(reply) -> np.ndarray:
    return _vector(reply) - _vector(build_model(_plan().model, 0))


def _server_replay(run_config, noise_multiplier, seed):
    """The update the server computes itself, on the node's data, with a seed it knows."""
    data = local_data(RunSettings.from_run_config(run_config), {"partition-id": 0, "num-partitions": 2}, SHARED_DATA,
                      partition_key=0)
    model = build_model(_plan().model, 0)
    train_round(model, data.features, data.labels, dataclasses.replace(_plan(), noise_multiplier=noise_multiplier),
                seed=seed, client=0, round_=1, device="cpu")
    return _vector(model) - _vector(build_model(_plan().model, 0))


def _spent(state, client="0", delta=1e-5):
    return PrivacyLedger.load(state / "ledger.json").spent_at(client, delta)


@pytest.mark.parametrize("randomness", [{}, {"randomness": "seeded", "seed": 7}])
def test_two_runs_at_sigma_and_2sigma_do_not_cancel_the_noise(run_config, tmp_path, randomness):
    # The server trains the same model in two runs, at σ and 2σ, on a node it restarts in
    # between. Had both runs drawn the same noise, 2Δ₁ − Δ₂ would be the clean update.
    policy = {"epsilon-budget": math.inf, "public-num-examples": True, **randomness}
    first = _train(_context(run_config, tmp_path, **policy), run_key="run-a")
    second = _train(_context(run_config, tmp_path, **policy), run_key="run-b",
                    plan=dataclasses.replace(_plan(), noise_multiplier=2.0))
    clean = _server_replay(run_config, 0.0, seed=0)
    residual = 2 * _update(first) - _update(second) - clean
    # ‖residual‖ = 2 lr σ C ‖z₁ − z₂‖ / N ≈ 2 √(2d) / N when the draws are independent
    expected = 2 * math.sqrt(2 * len(clean)) / _size()
    assert 0.8 * expected < np.linalg.norm(residual) < 1.2 * expected


def test_the_server_cannot_regenerate_a_secure_nodes_noise(run_config, tmp_path):
    reply = _train(_context(run_config, tmp_path, **{"epsilon-budget": math.inf, "public-num-examples": True}))
    clean = _server_replay(run_config, 0.0, seed=0)
    actual_noise = _update(reply) - clean
    for seed in (0, 1):  # the run's seed and another the server might guess
        guessed_noise = _server_replay(run_config, 1.0, seed=seed) - clean
        r = np.corrcoef(actual_noise, guessed_noise)[0, 1]
        assert abs(r) < 6 / math.sqrt(len(clean))  # independent: r ~ N(0, 1/d); a replay gives r ≈ 1


def test_a_second_run_and_a_restart_cannot_reset_the_budget(run_config, tmp_path):
    one, two = (epsilon_of(ComposedEvent(_one_round() * k), 1e-5) for k in (1, 2))
    policy = {"epsilon-budget": (one + two) / 2, "public-num-examples": True}
    assert not _train(_context(run_config, tmp_path, **policy), run_key="run-a").has_error()
    for run_id in (1, 2):  # the node restarts (a new Context) and a new run begins
        refusal = _train(_context(run_config, tmp_path, run_id=run_id, **policy), run_key=f"run-{run_id}x")
        assert refusal.has_error() and refusal.error.code == protocol.REFUSAL_CODE
        assert "exceed its budget" in refusal.error.reason
    assert _spent(tmp_path) == pytest.approx(one)


def test_a_replayed_round_is_refused_not_run_again(run_config, tmp_path):
    context = _context(run_config, tmp_path, **{"epsilon-budget": math.inf, "public-num-examples": True})
    assert not _train(context).has_error()
    replay = _train(context, plan=dataclasses.replace(_plan(), noise_multiplier=50.0))
    assert replay.has_error() and "already ran" in replay.error.reason
    assert list(PrivacyLedger.load(tmp_path / "ledger.json").entries("0")) == [protocol.train_entry("run-a", 1)]


def test_a_node_without_a_budget_refuses_and_says_what_to_set(run_config, tmp_path):
    node_config = {"partition-id": 0, "num-partitions": 2}
    context = Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                      run_config={**run_config, "client-epsilon-budget": 1.0})
    for reply in (_train(context), _query(context)):
        assert reply.has_error() and reply.error.code == protocol.REFUSAL_CODE
        assert "epsilon-budget" in reply.error.reason and "--node-config" in reply.error.reason


def test_the_run_config_can_tighten_the_policy_but_never_loosen_it(run_config, tmp_path):
    one = epsilon_of(ComposedEvent(_one_round()), 1e-5)
    at_09 = epsilon_of(ComposedEvent(_one_round()), 0.9)
    policy = {"epsilon-budget": (one + at_09) / 2, "public-num-examples": True}  # fits at δ 0.9, not at 1e-5
    loosen = {**run_config, "delta": 0.9, "client-epsilon-budget": 100.0}
    refusal = _train(_context(loosen, tmp_path, **policy))
    assert refusal.has_error() and "δ = 1e-05" in refusal.error.reason
    tighten = {**run_config, "client-epsilon-budget": one / 2}
    refusal = _train(_context(tighten, tmp_path, **{**policy, "epsilon-budget": math.inf}))
    assert refusal.has_error() and "exceed its budget" in refusal.error.reason
    seeded_by_server = _train(_context({**run_config, "local-randomness": "run-seed"}, tmp_path, **policy))
    assert seeded_by_server.has_error() and "unknown run-config keys" in seeded_by_server.error.reason


def test_a_train_reply_carries_the_model_and_its_booked_events_and_nothing_else(run_config, tmp_path):
    context = _context(run_config, tmp_path, **{"epsilon-budget": math.inf})  # N private: QUERY first
    assert _train(context).has_error()
    released = _query(context).content.config_records[protocol.INFO][protocol.NUM_EXAMPLES]
    reply = _train(context)
    assert set(reply.content.keys()) == {protocol.ARRAYS, protocol.PRIVACY}  # no loss, no N
    charge = protocol.read_charge(reply.content.config_records[protocol.PRIVACY])
    assert charge.events == _plan().round_events(released)  # q and steps of the released N, not the true one
    assert PrivacyLedger.load(tmp_path / "ledger.json").entries("0")[charge.entry] == charge.events


def test_n_leaves_only_as_a_booked_gaussian_count(run_config, tmp_path):
    # Prepare: 400 fresh nodes (own state each) holding the same N = 100 records
    released = []
    for i in range(400):
        context = _context(run_config, tmp_path / str(i), **{"epsilon-budget": 1.0, "num-examples-noise": 20.0})
        info = _query(context).content.config_records[protocol.INFO]
        assert info[protocol.NUM_EXAMPLES_PUBLIC] is False
        released.append(info[protocol.NUM_EXAMPLES])
    # Assert: the count is N + N(0, 20²) rounded: mean N, std 20 (5σ bounds), and booked
    released = np.array(released, dtype=float)
    assert abs(released.mean() - _size()) < 5 * 20 / math.sqrt(400)
    chi2 = (len(released) - 1) * released.var(ddof=1) / (20**2 + 1 / 12)
    assert stats.chi2.sf(chi2, 399) > 1e-6 and stats.chi2.cdf(chi2, 399) > 1e-6
    ledger = PrivacyLedger.load(tmp_path / "0" / "ledger.json")
    assert list(ledger.entries("0").values()) == [(GaussianEvent(20.0),)]
    # Execute again: the same node resends the same value and books nothing more
    again = _query(_context(run_config, tmp_path / "0", **{"epsilon-budget": 1.0, "num-examples-noise": 20.0}))
    assert again.content.config_records[protocol.INFO][protocol.NUM_EXAMPLES] == released[0]
    assert PrivacyLedger.load(tmp_path / "0" / "ledger.json") == ledger


def _evaluate(context, run_key="run-a", server_round=1):
    config = ConfigRecord({protocol.MODEL: "cnn", protocol.SERVER_ROUND: server_round, protocol.RUN_KEY: run_key})
    arrays = ArrayRecord(build_model("cnn", 0).state_dict())
    return _send(context, RecordDict({protocol.ARRAYS: arrays, protocol.CONFIG: config}), MessageType.EVALUATE)


@pytest.mark.usefixtures("one_torch_thread")  # 200 evaluations of a small CNN
def test_evaluate_is_refused_by_default_and_noisy_and_booked_when_allowed(run_config, tmp_path):
    refused = _evaluate(_context(run_config, tmp_path / "default", **{"epsilon-budget": math.inf}))
    assert refused.has_error() and "allow-evaluate" in refused.error.reason
    assert not booked(tmp_path / "default")  # nothing booked, nothing computed
    # The label-histogram attack asks many evaluations; each is noisy and each is booked
    context = _context(run_config, tmp_path / "allowed", **{"epsilon-budget": math.inf, "allow-evaluate": True,
                                                           "evaluate-noise": 20.0, "public-num-examples": True})
    counts = []
    for r in range(1, 201):
        metrics = _evaluate(context, server_round=r).content.metric_records[protocol.METRICS]
        counts.append(metrics[protocol.COUNT])
    n_test = 100  # partition 0 of 2 of the first 200 test examples
    counts = np.array(counts)
    assert abs(counts.mean() - n_test) < 5 * 20 / math.sqrt(200)
    chi2 = 199 * counts.var(ddof=1) / 20**2
    assert stats.chi2.sf(chi2, 199) > 1e-6 and stats.chi2.cdf(chi2, 199) > 1e-6
    assert len(PrivacyLedger.load(tmp_path / "allowed" / "ledger.json").entries("0")) == 200


def test_a_model_that_makes_gradients_non_finite_still_gets_a_finite_reply(run_config, tmp_path):
    # The NaN oracle: weights chosen so that every logit is +inf, the loss inf - inf = NaN
    state = build_model("cnn", 0).state_dict()
    state["7.bias"] = torch.full_like(state["7.bias"], 1e3)  # tanh saturates at exactly 1
    state["9.weight"] = torch.full_like(state["9.weight"], 1e38)  # 32 · 1e38 overflows
    reply = _train(_context(run_config, tmp_path, **{"epsilon-budget": math.inf, "public-num-examples": True}),
                   arrays=ArrayRecord(state))
    assert not reply.has_error()
    assert np.isfinite(_vector(reply)).all()
    global_arrays = ArrayRecord(state)
    problem = check_train_reply(reply, Charge(protocol.train_entry("run-a", 1), _one_round()), global_arrays,
                                update_norm_bound(_plan(), _size(), sum(v.numel() for v in state.values())))
    assert problem is None


@pytest.mark.parametrize("mangle", [
    lambda config, arrays: (ConfigRecord({k: v for k, v in config.items() if k != protocol.RUN_KEY}), arrays),
    lambda config, arrays: (ConfigRecord({**config, protocol.RUN_KEY: "../../etc"}), arrays),
    lambda config, arrays: (ConfigRecord({**config, protocol.SERVER_ROUND: -1}), arrays),
    lambda config, arrays: (ConfigRecord({**config, "max-grad-norm": "big"}), arrays),
    lambda config, arrays: (config, ArrayRecord([np.zeros(3, dtype=np.float32)])),
    lambda config, arrays: (None, arrays),
])
def test_a_malformed_train_message_is_refused_and_books_nothing(run_config, tmp_path, mangle):
    config = ConfigRecord({**protocol.plan_config(_plan()), protocol.SERVER_ROUND: 1, protocol.RUN_KEY: "run-a"})
    config, arrays = mangle(config, ArrayRecord(build_model(_plan().model, 0).state_dict()))
    content = RecordDict({protocol.ARRAYS: arrays, **({protocol.CONFIG: config} if config is not None else {})})
    reply = _send(_context(run_config, tmp_path, **{"epsilon-budget": math.inf, "public-num-examples": True}),
                  content, MessageType.TRAIN)
    assert reply.has_error() and reply.error.code == protocol.REFUSAL_CODE
    assert not booked(tmp_path)


@pytest.mark.usefixtures("one_torch_thread")  # 200 evaluations of a small CNN
def test_an_evaluation_releases_each_records_loss_clipped_whatever_the_model(run_config, tmp_path):
    # The curious server sends a model whose loss is NaN on every record (the NaN-oracle
    # weights): each record must still count at most LOSS_CLIP in the loss sum, so the
    # release is the clipped sum plus N(0, (LOSS_CLIP·s)²) and nothing non-finite.
    state = build_model("cnn", 0).state_dict()
    state["7.bias"] = torch.full_like(state["7.bias"], 1e3)
    state["9.weight"] = torch.full_like(state["9.weight"], 1e38)
    context = _context(run_config, tmp_path, **{"epsilon-budget": math.inf, "allow-evaluate": True,
                                                "evaluate-noise": 20.0, "public-num-examples": True})
    config = ConfigRecord({protocol.MODEL: "cnn", protocol.RUN_KEY: "run-a"})
    losses = []
    for r in range(1, 201):
        config[protocol.SERVER_ROUND] = r
        reply = _send(context, RecordDict({protocol.ARRAYS: ArrayRecord(state), protocol.CONFIG: config}),
                      MessageType.EVALUATE)
        losses.append(reply.content.metric_records[protocol.METRICS][protocol.LOSS_SUM])
    losses = np.array(losses)
    n_test, std = 100, LOSS_CLIP * 20.0
    assert np.isfinite(losses).all()
    assert abs(losses.mean() - n_test * LOSS_CLIP) < 5 * std / math.sqrt(200)
    chi2 = 199 * losses.var(ddof=1) / std**2
    assert stats.chi2.sf(chi2, 199) > 1e-6 and stats.chi2.cdf(chi2, 199) > 1e-6


def test_the_server_cannot_choose_which_folder_a_node_reads(run_config, tmp_path):
    # The curious server names another folder (an empty one, or one it fills) in the run
    # config, and asks for a download: the node reads only its own policy's data-dir.
    empty = tmp_path / "server-chosen"
    empty.mkdir()
    policy = {"epsilon-budget": math.inf, "public-num-examples": True, "randomness": "seeded", "seed": 3}
    replies = {}
    for name, config in {"none": run_config, "other": {**run_config, "data-dir": str(empty), "download": True}}.items():
        context = _context(config, tmp_path / name, **policy)
        size = _query(context).content.config_records[protocol.INFO][protocol.NUM_EXAMPLES]
        replies[name] = size, _update(_train(context))
    assert replies["none"][0] == replies["other"][0] == _size()  # the same partition
    np.testing.assert_array_equal(replies["none"][1], replies["other"][1])  # the same update
    assert list(empty.iterdir()) == []  # nothing downloaded into the server's folder


def test_a_node_without_its_data_refuses_before_booking_anything(run_config, shared_data_dir, tmp_path):
    # Its policy's folder lacks MNIST; the run config names one that holds it. Every message
    # is refused with one line that does not name the node's folder, and nothing is booked
    # (N private: a QUERY that got as far as its count would book it).
    own = tmp_path / "node-data"
    own.mkdir()
    context = _context({**run_config, "data-dir": str(shared_data_dir)}, tmp_path / "state", data_dir=own,
                       **{"epsilon-budget": math.inf, "allow-evaluate": True})
    for reply in (_query(context), _train(context), _evaluate(context)):
        assert reply.has_error() and reply.error.code == protocol.REFUSAL_CODE
        assert "holds no mnist in its policy's data-dir" in reply.error.reason
        assert str(own) not in reply.error.reason and "\n" not in reply.error.reason
    assert not booked(tmp_path / "state")
    assert not (tmp_path / "state" / "releases.json").exists()
    assert list(own.iterdir()) == []


def test_a_server_cannot_make_a_node_compute_more_at_once_than_its_memory_holds(run_config, tmp_path, monkeypatch):
    # The server asks for one physical batch of a million examples (a lot of every record at
    # once could exhaust the node's memory). The node's own device budget here fits 10.
    # the node's noise
    secure_step = dataclasses.replace(_plan().dpsgd_config(_size(), physical_batch=1), secure_mode=True)
    memory = measure_step_memory(build_model(_plan().model, 0), (1, 28, 28), secure_step,
                                 optimizer=lambda m: training.make_optimizer(m, _plan(), 1))
    monkeypatch.setattr(training, "device_budget", lambda device: memory.bytes_at(10))
    used = []

    def recording_train_dpsgd(*args, config, **kwargs):
        used.append(config.max_physical_batch_size)
        return train_dpsgd(*args, config=config, **kwargs)

    monkeypatch.setattr(training, "train_dpsgd", recording_train_dpsgd)
    policy = {"epsilon-budget": math.inf, "public-num-examples": True}
    for requested in (10**6, 7):
        reply = _train(_context(run_config, tmp_path / str(requested), **policy),
                       plan=dataclasses.replace(_plan(), max_physical_batch_size=requested))
        assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    # Assert: the node trained in batches that fit its memory; a smaller request it keeps
    assert used == [10, 7]
