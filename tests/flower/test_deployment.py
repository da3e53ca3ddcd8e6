"""Real deployments on loopback: a SuperLink with TLS and SuperNode authentication, SuperNodes
as separate processes with their own policies and ledgers; each test stops what it started."""

import json
import subprocess
import sys
from pathlib import Path

import dp_accounting
import pytest

from fedpriv.privacy import PrivacyLedger
from fedpriv.privacy.events import to_dp_accounting
from simulations._federated import PROJECT_ROOT
from simulations.deployment import Deployment, Network, freeze_app

pytestmark = pytest.mark.slow


def _rdp_epsilon(ledger: PrivacyLedger, client: str, delta: float) -> float:
    """ε of every event in a node's ledger, composed by dp-accounting's own RDP accountant."""
    accountant = dp_accounting.rdp.RdpAccountant()
    for events in ledger.entries(client).values():
        for event in events:
            accountant.compose(to_dp_accounting(event))
    return accountant.get_epsilon(delta)


def _leftovers(folder: Path) -> str:
    """Processes whose command line names ``folder`` (every process a deployment starts does)."""
    done = subprocess.run(["pgrep", "-af", str(folder)], capture_output=True, text=True)
    return "\n".join(line for line in done.stdout.splitlines() if "pgrep" not in line)


def test_deployment_command_two_nodes_tls_auth_pinned_app(tmp_path, shared_data_dir):
    out = tmp_path / "deployment"
    done = subprocess.run(
        [sys.executable, "-m", "simulations.deployment", "--nodes", "2", "--rounds", "2", "--limit-train", "600",
         "--limit-test", "300", "--data-dir", str(shared_data_dir), "--out", str(out)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _leftovers(out) == ""
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert all(not r["failed"] and not r["rejected"] for r in results["rounds"])
    nodes = json.loads((out / "nodes.json").read_text())
    for client in ("0", "1"):
        # each node's own ledger: the DP count of its N, then one entry per round, within ε = 1
        ledger = PrivacyLedger.load(out / "nodes" / client / "state" / "ledger.json")
        entries = list(ledger.entries(client))
        assert len(entries) == 3 and entries[0].startswith("release/num-examples/")
        epsilon = _rdp_epsilon(ledger, client, 1e-5)
        assert 0.5 < epsilon <= 1.0 + 1e-9
        assert nodes[client]["epsilon"] == pytest.approx(epsilon, rel=1e-6)
        assert float(results["final_epsilon"][client]) == pytest.approx(epsilon, rel=1e-6)
    # the deployment really was TLS + authentication: the SuperLink's command line
    superlink_log = (out / "superlink" / "superlink.log").read_text()
    assert "--insecure" not in superlink_log


def test_a_node_runs_no_code_from_an_altered_app(tmp_path, shared_data_dir):
    # Prepare: the node pins the app; then the bundle the server sends is altered to leave a mark
    out = tmp_path / "deployment"
    deployment = Deployment(out, 1, Network())
    pinned = freeze_app(out / "app")
    deployment.prepare(policy={"epsilon-budget": 10.0, "state-dir": str(deployment.nodes[0].state),
                               "trusted-apps": [pinned]})
    mark = tmp_path / "altered-code-ran"
    with (out / "app" / "clients" / "client_app.py").open("a") as module:
        module.write(f"\nimport pathlib\npathlib.Path({str(mark)!r}).write_text('leaked')\n")
    try:
        deployment.start_superlink()
        deployment.start_node(0)
        # Execute
        run = deployment.start_run(out / "app", {"rounds": 1, "min-clients": 1, "limit-train": 200, "limit-test": 100,
                                                 "data-dir": str(shared_data_dir), "noise-multiplier": 1.0,
                                                 "out": str(out)})
        code = run.process.wait(timeout=300)
    finally:
        deployment.close()
    # Assert: the node refused the bundle before any of its code ran, and booked nothing
    node_log = deployment.nodes[0].log.read_text() + run.tail(20000)
    assert not mark.exists()
    assert "is not one this node trusts" in node_log, node_log[-3000:]
    assert not (deployment.nodes[0].state / "ledger.json").exists()
    assert code == 0 and "Nothing to train: no node described itself" in run.tail(20000)
