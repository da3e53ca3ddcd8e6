"""The malicious server against a central user-level node with a noise floor: it names less
noise than the node's ``min-user-noise-multiplier`` accepts (a small z, or a count-only
round's small σ_b), and the node refuses before it books or trains anything."""

import pytest

from fedpriv.federation import protocol
from fedpriv.federation.policy import NodePolicy, PolicyError
from fedpriv.privacy import GaussianEvent, PrivacyLedger
from server.run import run_server
from tests.flower.inprocess import InProcessGrid, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

NODES, FLOOR = 3, 1.0


def _run_config(data_dir, state, **extra):
    return {"rounds": 2, "min-clients": NODES, "limit-train": 60, "limit-test": 40, "model": "cnn",
            "data-dir": str(data_dir), "state-dir": str(state / "server"), "privacy": "user", "cohort": NODES,
            "user-clip": 1.0, "server-randomness": "seeded", "seed": 3, "lot-size": 10, "lr": 0.1,
            "epsilon-budget": 100.0, **extra}


def _nodes(state, data_dir):
    keys = {"epsilon-budget": 100.0, "public-num-examples": True, "allow-central-user": True,
            "data-dir": str(data_dir), "min-user-noise-multiplier": FLOOR}
    return {10 + i: node_config(i, NODES, state, **keys) for i in range(NODES)}


def _booked(state):
    return [PrivacyLedger.load(state / f"node{i}" / "ledger.json").events(str(i)) for i in range(NODES)]


def test_a_z_below_the_nodes_floor_is_refused_before_booking(tmp_path, shared_data_dir):
    config = _run_config(shared_data_dir, tmp_path, **{"noise-multiplier": 0.3})
    history = run_server(InProcessGrid(config, _nodes(tmp_path, shared_data_dir)), config)
    assert all(len(r.failed) == NODES for r in history.rounds)
    assert all("min-user-noise-multiplier" in reason for r in history.rounds for reason in r.failed.values())
    assert _booked(tmp_path) == [()] * NODES


def test_at_the_floor_the_round_runs_and_books_z_over_two(tmp_path, shared_data_dir):
    config = _run_config(shared_data_dir, tmp_path, **{"noise-multiplier": FLOOR, "rounds": 1})
    history = run_server(InProcessGrid(config, _nodes(tmp_path, shared_data_dir)), config)
    assert not history.rounds[0].failed
    assert _booked(tmp_path) == [(GaussianEvent(FLOOR / 2),)] * NODES


def test_a_count_only_round_below_half_the_floor_is_refused_before_booking(tmp_path, shared_data_dir):
    class Forged(InProcessGrid):  # the server's config says σ_b = 2; what it sends says 0.1
        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            for m in messages:
                config = m.content.config_records.get(protocol.CONFIG)
                if config is not None and config.get("count-only") is True:
                    config["clip-count-noise"] = 0.1
            return super().send_and_receive(messages, timeout=timeout)

    config = _run_config(shared_data_dir, tmp_path, **{"noise-multiplier": 2.0, "clip-quantile": 0.5,
                                                       "clip-count-noise": 2.0, "clip-warmup-rounds": 1})
    history = run_server(Forged(config, _nodes(tmp_path, shared_data_dir)), config)
    assert len(history.rounds[0].failed) == NODES
    assert all("min-user-noise-multiplier" in reason for reason in history.rounds[0].failed.values())
    assert all(events.count(GaussianEvent(0.1)) == 0 for events in _booked(tmp_path))


@pytest.mark.parametrize("floor", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_floor_is_refused_by_the_policy(tmp_path, floor):
    with pytest.raises(PolicyError, match="min-user-noise-multiplier"):
        NodePolicy(epsilon_budget=1.0, state_dir=tmp_path, min_user_noise_multiplier=floor)
