"""``accept-failures = false``: a round in which a sampled client failed keeps the previous
model and says why; with the default (true) the other clients' updates are aggregated.
In process, through ``server.run.run_server`` and the real ClientApp; node 1's own policy
budget is too small for one round, so it refuses every TRAIN (a failed reply)."""

import pytest

from fedpriv.models import build_model, model_sha256
from server.run import run_server
from tests.flower.inprocess import InProcessGrid, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

SEED = 3


def _run(tmp_path, data_dir, accept_failures):
    run_config = {"rounds": 1, "min-clients": 2, "limit-train": 40, "limit-test": 40, "lot-size": 10,
                  "noise-multiplier": 1.0, "model": "cnn", "seed": SEED, "data-dir": str(data_dir),
                  "accept-failures": accept_failures}
    nodes = {10 + i: node_config(i, 2, tmp_path, **{"epsilon-budget": budget, "public-num-examples": True,
                                                    "data-dir": str(data_dir)})
             for i, budget in enumerate([100.0, 1e-6])}
    return run_server(InProcessGrid(run_config, nodes), run_config)


def test_a_round_with_a_refusing_node_keeps_the_model_when_failures_are_not_accepted(tmp_path, shared_data_dir):
    history = _run(tmp_path, shared_data_dir, accept_failures=False)
    (round_log,) = history.rounds
    assert set(round_log.failed) == {"1"} and "budget" in round_log.failed["1"]
    assert "accept-failures = false" in round_log.discarded and "previous model is kept" in round_log.discarded
    # the global model is the initial one, bit for bit
    assert history.model_sha256 == model_sha256(build_model("cnn", SEED))
    assert history.to_json()["rounds"][0]["discarded"] == round_log.discarded  # results.json says why


def test_by_default_the_other_nodes_updates_are_aggregated(tmp_path, shared_data_dir):
    history = _run(tmp_path, shared_data_dir, accept_failures=True)
    (round_log,) = history.rounds
    assert set(round_log.failed) == {"1"} and round_log.discarded is None
    assert history.model_sha256 != model_sha256(build_model("cnn", SEED))


def test_the_simulation_flag_sets_the_run_config_key():
    from simulations._federated import build_parser
    from simulations._run_config import run_config_overrides

    def key(*argv):
        return run_config_overrides(build_parser("mnist").parse_args(list(argv)), "mnist").get("accept-failures")

    assert (key(), key("--accept-failures"), key("--no-accept-failures")) == (None, True, False)
