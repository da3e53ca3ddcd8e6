"""Distributed rounds on SecAgg+'s sparse graph end to end, in process: the run config's
``secagg-neighbours`` reaches the server's secure sum, each node's ``min-secagg-neighbours``
its checks; a node whose policy sets none refuses before it books, the others' round goes on."""

import pytest

from fedpriv.federation.settings import RunSettings, SettingsError
from fedpriv.secagg import graph
from server.run import run_server
from tests.flower.inprocess import InProcessGrid, booked
from tests.flower.test_distributed_round import _config, _initial_sha, _nodes

pytestmark = pytest.mark.usefixtures("task_identity")


def test_a_sparse_round_sums_the_consenting_nodes_and_a_node_without_consent_refuses(tmp_path, shared_data_dir):
    run_config = _config(shared_data_dir, rounds=1, **{"min-clients": 8, "secagg-neighbours": 4})
    policies = [{"min-cohort": 2, "min-secagg-neighbours": 4}] * 7 + [{"min-cohort": 2}]
    history = run_server(InProcessGrid(run_config, _nodes(tmp_path, shared_data_dir, policies)), run_config)
    (round_log,) = history.rounds  # node 7's 4 neighbours keep 4 of their group of 5: t = ⌊2·5/3⌋ + 1 = 4
    assert graph.threshold(8, 4) == 4
    assert round_log.discarded is None and round_log.survivors == [str(i) for i in range(7)]
    assert "demands the full graph" in round_log.failed["7"]
    assert history.resolved["secagg_neighbours"] == 4 and history.model_sha256 != _initial_sha()
    assert not [k for k in booked(tmp_path / "node7").get("7", {}) if k.endswith("/train")]
    assert all([k for k in booked(tmp_path / f"node{i}")[str(i)] if k.endswith("/train")] for i in range(7))


@pytest.mark.parametrize("k", [-2, 3])
def test_secagg_neighbours_is_zero_or_even(k: int) -> None:
    with pytest.raises(SettingsError, match="secagg-neighbours must be even and >= 0"):
        RunSettings.from_run_config({"privacy": "distributed", "secagg-neighbours": k})
