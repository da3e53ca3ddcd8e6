"""Real deployments on loopback: a SuperLink with TLS and SuperNode authentication, SuperNodes
as separate processes with their own policies and ledgers; each test stops what it started.
Each waits for events (a checkpoint, a ledger entry, a process's exit); its limits are
hang guards (tests/timeouts.py)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dp_accounting
import pytest

from fedpriv.privacy import PrivacyLedger
from fedpriv.privacy.events import to_dp_accounting
from simulations._federated import PROJECT_ROOT
from simulations._netns import NamespaceNetwork, Network, check_netns
from simulations._orchestrator import Deployment, freeze_app
from simulations._processes import Processes, base_env
from tests.flower.inprocess import booked
from tests.processes import describe, leftovers
from tests.timeouts import scaled, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def _rdp_epsilon(ledger: PrivacyLedger, client: str, delta: float) -> float:
    """ε of every event in a node's ledger, composed by dp-accounting's own RDP accountant."""
    accountant = dp_accounting.rdp.RdpAccountant()
    for events in ledger.entries(client).values():
        for event in events:
            accountant.compose(to_dp_accounting(event))
    return accountant.get_epsilon(delta)


def _left_running(mark: str, grace: float = 20) -> str:
    """The processes of this test still running after ``scaled(grace)`` s ("" when none)."""
    deadline = time.monotonic() + scaled(grace)
    while (found := leftovers(mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return describe(found)


def _checkpointed_round(out: Path) -> int:
    """The last round the server's checkpoint in ``out/server`` holds (-1 before the first)."""
    from server.state import ServerState, StateError

    try:
        return ServerState(out / "server").load()[0].completed_round
    except (FileNotFoundError, StateError, ValueError):
        return -1


def test_deployment_command_survives_a_superlink_kill_with_resume(tmp_path, shared_data_dir, process_mark):
    # Prepare: the deployment command, 2 nodes, 2 rounds (TLS, authenticated nodes, pinned app)
    out = tmp_path / "deployment"
    command = [sys.executable, "-m", "simulations.deployment", "--nodes", "2", "--rounds", "2", "--limit-train",
               "600", "--limit-test", "300", "--data-dir", str(shared_data_dir), "--out", str(out)]
    with Processes() as processes:  # stops the command's group and what it started, whatever happens
        first = processes.start("deployment", command, base_env(), tmp_path / "first.log", cwd=PROJECT_ROOT)
        # Execute: kill the SuperLink (and the ServerApp it runs) once round 1 is checkpointed
        wait_for(lambda: _checkpointed_round(out) >= 1, first.process, "checkpoint of round 1", 900)
        superlink = subprocess.run(["pgrep", "-f", f"flower-superlink.*{out}"], capture_output=True, text=True)
        os.killpg(int(superlink.stdout.split()[0]), signal.SIGKILL)
        assert processes.wait(first, timeout=scaled(300)) != 0
        assert _left_running(process_mark) == ""  # the failed command stopped every process it started
        resumed = processes.start("resumed", [*command, "--resume"], base_env(), tmp_path / "resumed.log",
                                  cwd=PROJECT_ROOT)
        code = processes.wait(resumed, timeout=scaled(1200))
    # Assert: the resumed run finished round 2 under the same run key; nothing is left running
    assert code == 0, resumed.tail()
    assert _left_running(process_mark) == ""
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert all(not r["failed"] and not r["rejected"] for r in results["rounds"])
    nodes = json.loads((out / "nodes.json").read_text())
    for client in ("0", "1"):
        # each node's own ledger: its DP count of N, then rounds 1 and 2 once each, within ε = 1
        ledger = PrivacyLedger.load(out / "nodes" / client / "state" / "ledger.json")
        entries = list(ledger.entries(client))
        assert entries[0].startswith("release/num-examples/")
        assert [e.split("/", 1)[1] for e in entries[1:]] == ["round-1/train", "round-2/train"]
        assert entries[1].split("/")[0] == entries[2].split("/")[0] == results["run_key"]
        epsilon = _rdp_epsilon(ledger, client, 1e-5)
        assert 0.5 < epsilon <= 1.0 + 1e-9
        assert nodes[client]["epsilon"] == pytest.approx(epsilon, rel=1e-6)
        assert float(results["final_epsilon"][client]) == pytest.approx(epsilon, rel=1e-6)


def test_a_killed_supernode_keeps_its_ledger_and_its_budget(tmp_path, shared_data_dir):
    # Prepare: two nodes with ε = 1 each; a run of 2 rounds calibrated to ε = 1 that goes on
    # with one node (a node stopped with SIGTERM leaves the SuperLink at once, which answers
    # its messages with an error: the round need not wait out its timeout, a hang guard)
    out = tmp_path / "deployment"
    deployment = Deployment(out, 2, Network())
    deployment.prepare(1.0, 1e-5, freeze_app(out / "app"), shared_data_dir)
    config = {"rounds": 2, "min-clients": 1, "target-epsilon": 1.0, "limit-train": 2000, "limit-test": 200,
              "local-epochs": 2, "data-dir": str(shared_data_dir), "round-timeout": scaled(900)}
    victim = deployment.nodes[1].state / "ledger.json"

    def booked_round_2() -> bool:
        return victim.exists() and any(e.endswith("round-2/train") for e in PrivacyLedger.load(victim).entries("1"))

    try:
        deployment.start_superlink(timeout=scaled(300))
        for i in range(2):
            deployment.start_node(i)
        deployment.wait_online(2, timeout=scaled(300))
        # Execute: kill node 1 once it has booked round 2 (before it can reply), let the run
        # finish, restart the node and start a second run
        run = deployment.start_run(out / "app", {**config, "out": str(out / "run1")})
        wait_for(booked_round_2, run.process, "round-2 booking by node 1", 900)
        deployment.processes.stop(deployment.supernodes[1])  # `kill`: SIGTERM, its group
        assert deployment.processes.wait(run, timeout=scaled(900)) == 0, run.tail()
        booked = PrivacyLedger.load(victim).entries("1")
        deployment.wait_online(1, timeout=scaled(300))  # the SuperLink knows it left; now the node may rejoin
        deployment.start_node(1)
        deployment.wait_online(2, timeout=scaled(300))
        again = deployment.start_run(out / "app", {**config, "rounds": 1, "out": str(out / "run2")})
        assert deployment.processes.wait(again, timeout=scaled(900)) == 0, again.tail()
    finally:
        deployment.close()
    # Assert: round 2 went on without node 1; the restarted node kept its ledger, the round
    # it booked before dying included, and with its ε spent refused the second run
    first = json.loads((out / "run1" / "results.json").read_text())
    assert [r["participants"] for r in first["rounds"]] == [["0", "1"], ["0", "1"]]
    assert first["rounds"][0]["failed"] == {} and list(first["rounds"][1]["failed"]) == ["1"]
    assert first["final_accuracy"] > 0.5
    second = json.loads((out / "run2" / "results.json").read_text())
    assert "exceed its budget" in second["rounds"][0]["failed"]["1"]
    after = PrivacyLedger.load(victim)
    assert after.entries("1") == booked and len(booked) == 3
    assert 0.5 < _rdp_epsilon(after, "1", 1e-5) <= 1.0 + 1e-9


def test_a_node_runs_no_code_from_an_altered_app(tmp_path, shared_data_dir):
    # Prepare: the node pins the app; then the bundle the server sends is altered to leave a mark
    out = tmp_path / "deployment"
    deployment = Deployment(out, 1, Network())
    pinned = freeze_app(out / "app")
    deployment.prepare(10.0, 1e-5, pinned, shared_data_dir)
    mark = tmp_path / "altered-code-ran"
    with (out / "app" / "clients" / "client_app.py").open("a") as module:
        module.write(f"\nimport pathlib\npathlib.Path({str(mark)!r}).write_text('leaked')\n")
    try:
        deployment.start_superlink(timeout=scaled(300))
        deployment.start_node(0)
        # Execute
        run = deployment.start_run(out / "app", {"rounds": 1, "min-clients": 1, "limit-train": 200, "limit-test": 100,
                                                 "data-dir": str(shared_data_dir), "noise-multiplier": 1.0,
                                                 "out": str(out)})
        code = deployment.processes.wait(run, timeout=scaled(900))
    finally:
        deployment.close()
    # Assert: the node refused the bundle before any of its code ran, and booked nothing
    node_log = deployment.nodes[0].log.read_text() + run.tail(20000)
    assert not mark.exists()
    assert "is not one this node trusts" in node_log, node_log[-3000:]
    assert not booked(deployment.nodes[0].state)
    assert code == 0 and "Nothing to train: no node described itself" in run.tail(20000)


def test_netns_puts_each_supernode_on_its_own_host(tmp_path):
    reason = check_netns()
    if reason:
        pytest.skip(f"--netns needs network namespaces: {reason}")
    # Prepare: a bridge and two namespaces; the SuperLink listens on the bridge only
    out = tmp_path / "deployment"
    with NamespaceNetwork(2, f"t{os.getpid() % 10000}").up() as network:
        deployment = Deployment(out, 2, network)
        deployment.prepare(1.0, 1e-5, "0" * 64)
        try:
            # Execute
            deployment.start_superlink(timeout=scaled(300))
            for i in range(2):
                deployment.start_node(i)
            deployment.wait_online(2, timeout=scaled(300))
            namespaces = [subprocess.run(["ip", "netns", "identify", str(node.process.pid)], capture_output=True,
                                         text=True).stdout.strip() for node in deployment.supernodes.values()]
        finally:
            deployment.close()
    # Assert: both nodes reached the SuperLink at 10.77.0.1 from their own namespace (where
    # 127.0.0.1 is their own loopback), and the namespaces are gone afterwards
    assert namespaces == [network.namespace(0), network.namespace(1)]
    assert deployment.address.startswith("10.77.0.1:")
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert network.namespace(0) not in left and network.namespace(1) not in left
