"""``accept-failures = false``: a round in which a sampled client failed keeps the previous
model and says why; with the default (true) the other clients' updates are aggregated.
In process, through ``server.run.run_server`` and the real ClientApp; in local mode node 1's
own policy budget is too small for one round, so it refuses every TRAIN (a failed reply);
in distributed mode a node's masked vector is lost."""

import contextlib
import logging
from collections.abc import Iterator

import pytest

from fedpriv.models import build_model, model_sha256
from server.history import epsilon_text
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


def test_distributed_mode_keeps_the_model_when_a_node_drops_out_and_failures_are_not_accepted(
        tmp_path, shared_data_dir):
    """The same rule in distributed mode (issue 34: its own round loop skipped ``close_round``,
    so it stepped on the survivors' sum and logged no client's ε). 5 nodes tolerating one
    dropout; node 4's masked vector is lost: the secure sum has 4 survivors, and the round
    is discarded because a member failed, each client's ε logged."""
    from fedpriv.secagg.stages import Stage
    from tests.flower.test_distributed_round import _config, _initial_sha, _nodes, _stage

    run_config = _config(shared_data_dir, rounds=1, **{"min-clients": 5, "limit-train": 100,
                                                        "accept-failures": False})
    grid = InProcessGrid(run_config, _nodes(tmp_path, shared_data_dir, [{"min-cohort": 5, "max-dropouts": 1}] * 5))
    grid.lose = lambda node, message: node == 14 and _stage(message) == Stage.COLLECT
    with _flower_log() as records:
        history = run_server(grid, run_config)
    (round_log,) = history.rounds
    assert round_log.survivors == ["0", "1", "2", "3"] and set(round_log.failed) == {"4"}
    assert "accept-failures = false" in round_log.discarded and "previous model is kept" in round_log.discarded
    assert history.model_sha256 == _initial_sha()
    for cid in map(str, range(5)):  # ε after the round, as the server's ledger has it, for every member
        line = f"\tclient {cid}: ε = {epsilon_text(round_log.epsilon[cid])} (δ = 1e-05)"
        assert line in records and round_log.epsilon[cid] > 0


@contextlib.contextmanager
def _flower_log() -> Iterator[list[str]]:
    """The messages Flower's logger (which fedpriv's server logs through) emits meanwhile."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("flwr").addHandler(handler)
    try:
        yield records
    finally:
        logging.getLogger("flwr").removeHandler(handler)
