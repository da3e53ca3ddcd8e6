"""Central user-level DP-FedAvg as ``python -m simulations.deployment --privacy user`` runs it:
a SuperLink with TLS and authenticated SuperNodes, each node opted in to trusting the
server with the noise (``allow-central-user``); the two ledgers checked against the closed
form and dp-accounting's own accountant. (A node without that opt-in refuses and books
nothing: tests/userlevel/test_central.py, in process.)"""

import json
import sys
import tomllib

import dp_accounting
import pytest

from fedpriv.privacy import GaussianEvent, PoissonSampledEvent, PrivacyLedger
from fedpriv.privacy.accountants.rdp import ORDERS
from simulations._federated import PROJECT_ROOT
from simulations._processes import Processes, base_env
from simulations.deployment import summary
from tests.processes import describe, leftovers
from tests.timeouts import scaled

pytestmark = pytest.mark.cluster

NODES, COHORT, ROUNDS, Z, NODE_BUDGET, DELTA = 3, 2, 2, 1.0, 100.0, 1e-5
N_NOISE = 20.0  # the default num-examples-noise of a node's policy: its DP count of N


def _rdp(events: list[dp_accounting.DpEvent]) -> float:
    """dp-accounting's RDP ε at the ledgers' orders (its default grid stops below the best
    order of a lone GaussianEvent(20): a node never sampled would read 0.1816 for 0.1777)."""
    accountant = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    for event in events:
        accountant.compose(event)
    return accountant.get_epsilon(DELTA)


@pytest.mark.slow
def test_a_deployed_central_user_level_run_books_the_population_and_each_nodes_own_rounds(
        tmp_path, shared_data_dir, process_mark):
    # Prepare: 3 nodes, an expected cohort of 2 (q = 2/3), z = 1, 2 rounds, secure server randomness
    out = tmp_path / "deployment"
    command = [sys.executable, "-m", "simulations.deployment", "--nodes", str(NODES), "--rounds", str(ROUNDS),
               "--privacy", "user", "--cohort", str(COHORT), "--noise-multiplier", str(Z), "--node-epsilon-budget",
               str(NODE_BUDGET), "--limit-train", "300", "--limit-test", "200", "--data-dir", str(shared_data_dir),
               "--out", str(out)]
    # Execute
    with Processes() as processes:
        run = processes.start("deployment", command, base_env(), tmp_path / "deployment.log", cwd=PROJECT_ROOT)
        code = processes.wait(run, timeout=scaled(900))
    # Assert: the run finished with every process stopped
    assert code == 0, run.tail()
    assert describe(leftovers(process_mark)) == ""
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert all(not r["failed"] and not r["rejected"] for r in results["rounds"])
    assert results["resolved"]["user_level"]["server_randomness"] == "secure"  # the OS CSPRNG, not the seed
    q, run_key = COHORT / NODES, results["run_key"]
    server = PrivacyLedger.load(out / "server" / "ledger.json")
    nodes = json.loads((out / "nodes.json").read_text())
    log = run.tail(20000)
    for client in map(str, range(NODES)):
        policy = tomllib.loads((out / "nodes" / client / "policy.toml").read_text())
        assert policy["allow-central-user"] is True and "allow-distributed" not in policy
        own = PrivacyLedger.load(out / "nodes" / client / "state" / "ledger.json").entries(client)
        releases = {e: events for e, events in own.items() if e.startswith("release/num-examples/")}
        assert list(releases.values()) == [(GaussianEvent(N_NOISE),)]  # its DP count of N, once
        # the population ledger: every client every round, sampled or not (plus the node's N release)
        assert server.entries(client) == {**releases, **{f"{run_key}/round-{r}/train": (
            PoissonSampledEvent(q, GaussianEvent(Z)),) for r in range(1, ROUNDS + 1)}}
        # the node's own ledger: z/2 for the rounds it took part in only, no amplification
        took_part = [r["round"] for r in results["rounds"] if client in r["participants"]]
        assert own == {**releases, **{f"{run_key}/round-{r}/train": (GaussianEvent(Z / 2),) for r in took_part}}
        # ε: each ledger against dp-accounting's RDP accountant on the closed-form events
        user_level = _rdp([dp_accounting.GaussianDpEvent(N_NOISE)] + [dp_accounting.PoissonSampledDpEvent(
            q, dp_accounting.GaussianDpEvent(Z))] * ROUNDS)
        record_level = _rdp([dp_accounting.GaussianDpEvent(N_NOISE)] + [dp_accounting.GaussianDpEvent(Z / 2)]
                            * len(took_part))
        assert float(results["final_epsilon"][client]) == pytest.approx(user_level, rel=1e-6)
        assert nodes[client]["epsilon"] == pytest.approx(record_level, rel=1e-6)
        assert (f"node {client}: record-level ε = {record_level:.4f} of budget {NODE_BUDGET:g} in its own ledger"
                in log), log[-3000:]
        assert f"client {client}: user-level ε = {user_level:.4f} in the server's population ledger" in log


def test_the_user_level_summary_labels_each_nodes_record_level_and_each_clients_user_level_epsilon(tmp_path):
    results = {"rounds": [{"round": 1}], "stopped": None, "final_accuracy": 0.5, "final_epsilon": {"0": 2.5},
               "resolved": {"user_level": {"noise_multiplier": 1.1, "sample_rate": 0.5}}}
    nodes = {"0": {"epsilon": 7.25, "entries": ["a", "b"]}}
    lines = summary(results, nodes, 3.0, tmp_path, 50.0).splitlines()
    assert lines[1] == ("node 0: record-level ε = 7.2500 of budget 50 in its own ledger (2 entries); client 0: "
                        "user-level ε = 2.5000 of target 3 in the server's population ledger (z = 1.1, q = 0.5)")
