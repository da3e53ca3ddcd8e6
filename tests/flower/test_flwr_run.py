"""``flwr run .`` against a SuperLink this test starts (loopback only) and always stops."""

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from fedpriv.certificates import TlsFiles, write_node_key, write_tls
from fedpriv.federation.policy import POLICY_ENV
from fedpriv.node import init_nodes
from simulations._federated import PROJECT_ROOT
from simulations._processes import (
    BIN,
    Processes,
    base_env,
    free_port,
    healthy,
    stop_group,
    superlink_command,
    supernode_command,
    write_flwr_config,
)
from tests.timeouts import scaled, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@contextlib.contextmanager
def _superlink(tmp_path: Path, simulation: bool, tls: TlsFiles | None = None, supernode_auth: bool = False,
               data_dir: Path | None = None):
    """A SuperLink on a free loopback port, with TLS when given its files; yields (env with
    FLWR_HOME pointing at it, port). The simulated nodes' policy (their operator's, their
    data in ``data_dir``) reaches them through the environment the SuperLink passes on."""
    port = free_port()
    home = tmp_path / "flwr-home"
    write_flwr_config(home, "test", f"127.0.0.1:{port}", tls)
    policy = tmp_path / "policy.toml"
    policy.write_text(f'epsilon-budget = 100.0\nstate-dir = "{tmp_path}/nodes/{{partition-id}}"\n'
                      'public-num-examples = true\n' + (f'data-dir = "{data_dir}"\n' if data_dir else ''))
    init_nodes(policy, range(2))  # the operator's `python -m fedpriv.node init`
    env = {**base_env(home), "PYTHONPATH": str(PROJECT_ROOT), POLICY_ENV: str(policy)}
    with Processes() as processes:
        started = processes.start("SuperLink", superlink_command(port, home / "state.db", tls, simulation=simulation,
                                                                 supernode_auth=supernode_auth),
                                  env, tmp_path / "superlink.log")
        processes.wait_until(lambda: healthy(f"127.0.0.1:{port}", tls), started, scaled(300),
                             "answer its health check")
        yield env, port


@pytest.fixture
def superlink(tmp_path, shared_data_dir):
    """A simulation SuperLink whose nodes hold MNIST; yields its env."""
    with _superlink(tmp_path, simulation=True, data_dir=shared_data_dir) as (env, _):
        yield env


def test_flwr_run_one_round_two_supernodes(superlink, tmp_path, shared_data_dir):
    out = tmp_path / "out"
    run_config = (f"rounds=1 min-clients=2 limit-train=400 limit-test=300 lot-size=50 noise-multiplier=1.0 "
                  f"data-dir='{shared_data_dir}' out='{out}'")
    done = subprocess.run(
        [BIN / "flwr", "run", ".", "test", "--run-config", run_config,
         "--federation-config", "num-supernodes=2 client-resources-num-cpus=1", "--stream"],
        cwd=PROJECT_ROOT, env=superlink, capture_output=True, text=True, timeout=scaled(900),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1]
    assert sorted(results["final_epsilon"]) == ["0", "1"]
    assert results["rounds"][0]["failed"] == {} and results["rounds"][0]["rejected"] == {}


def test_only_registered_supernodes_that_trust_the_ca_join(tmp_path):
    # Prepare: a TLS SuperLink with SuperNode authentication; node 0's key is registered
    tls = write_tls(tmp_path / "certs", ["127.0.0.1"])
    other_ca = write_tls(tmp_path / "other", ["127.0.0.1"])
    keys = {name: write_node_key(tmp_path / "keys", name) for name in ("registered", "unregistered")}
    with _superlink(tmp_path, simulation=False, tls=tls, supernode_auth=True) as (env, port):
        register = subprocess.run([BIN / "flwr", "supernode", "register", str(keys["registered"][1]), "test"],
                                  cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(300))
        assert register.returncode == 0, register.stdout + register.stderr

        def node(name, key, ca):
            command = supernode_command(f"127.0.0.1:{port}", "partition-id=0 num-partitions=1", ca, key=key,
                                        max_retries=2)
            return subprocess.Popen(command, env=env, stdout=(tmp_path / f"{name}.log").open("w"),
                                    stderr=subprocess.STDOUT, start_new_session=True)

        # Execute: the registered node, an unregistered key, and the registered key without the CA
        nodes = {"registered": node("registered", keys["registered"][0], tls.ca_cert),
                 "unregistered": node("unregistered", keys["unregistered"][0], tls.ca_cert),
                 "wrong-ca": node("wrong-ca", keys["registered"][0], other_ca.ca_cert)}
        def online() -> list[dict]:
            listing = subprocess.run([BIN / "flwr", "supernode", "ls", "test", "--format", "json"],
                                     cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(300))
            return [n for n in json.loads(listing.stdout)["nodes"] if n["status"] == "online"]

        try:
            refused = {name: nodes[name].wait(timeout=scaled(300)) for name in ("unregistered", "wrong-ca")}
            wait_for(lambda: len(online()) > 0, nodes["registered"], "registered node online", 300)
            joined = online()
        finally:
            for process in nodes.values():
                if process.poll() is None:
                    stop_group(process)
    # Assert: both others gave up with an error; only the registered node is online
    assert all(code != 0 for code in refused.values()), refused
    assert "Failed to activate SuperNode" in (tmp_path / "unregistered.log").read_text()
    assert len(joined) == 1, joined
