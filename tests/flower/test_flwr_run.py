"""``flwr run .`` against a SuperLink this test starts (loopback only) and always stops."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fedpriv.certificates import TlsFiles, write_node_key, write_tls
from fedpriv.federation.policy import POLICY_ENV
from fedpriv.privacy import GaussianEvent, PrivacyLedger
from simulations._federated import PROJECT_ROOT

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def _superlink(tmp_path: Path, simulation: bool, tls: TlsFiles | None = None, extra: tuple[str, ...] = ()):
    """A SuperLink on a free loopback port, with TLS when given its files; yields (env with
    FLWR_HOME pointing at it, port)."""
    port = _free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    trust = f'root-certificates = "{tls.ca_cert}"' if tls else "insecure = true"
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{port}"\n{trust}\n'
    )
    security = (["--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key)]
                if tls else ["--insecure"])
    # BIN first on PATH: the SuperLink starts flower-superexec by name, even from an
    # interpreter whose venv is not activated. The simulated nodes' policy (their
    # operator's) reaches them through the environment the SuperLink passes on.
    policy = tmp_path / "policy.toml"
    policy.write_text(f'epsilon-budget = 100.0\nstate-dir = "{tmp_path}/nodes/{{partition-id}}"\n'
                      'public-num-examples = true\n')
    env = {**os.environ, "FLWR_HOME": str(home), "PYTHONPATH": str(PROJECT_ROOT),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", POLICY_ENV: str(policy)}
    log = (tmp_path / "superlink.log").open("w")
    process = subprocess.Popen(
        [BIN / "flower-superlink", *security, *extra, *(["--simulation"] if simulation else []),
         "--isolation", "subprocess", "--host", "127.0.0.1", "--port", str(port),
         "--database", str(home / "state.db"), "--disable-runtime-dependency-installation"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not _healthy(port, tls):
            assert process.poll() is None and time.monotonic() < deadline, "SuperLink did not start"
            time.sleep(0.5)
        yield env, port
    finally:
        _stop(process)
        log.close()


@pytest.fixture
def superlink(tmp_path):
    """A simulation SuperLink; yields its env."""
    with _superlink(tmp_path, simulation=True) as (env, _):
        yield env


def _healthy(port: int, tls: TlsFiles | None = None) -> bool:
    try:
        if tls:
            return httpx.get(f"https://127.0.0.1:{port}/health", timeout=1, verify=str(tls.ca_cert)).is_success
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).is_success
    except httpx.HTTPError:
        return False


def test_flwr_run_one_round_two_supernodes(superlink, tmp_path, shared_data_dir):
    out = tmp_path / "out"
    run_config = (f"rounds=1 min-clients=2 limit-train=400 limit-test=300 lot-size=50 noise-multiplier=1.0 "
                  f"data-dir='{shared_data_dir}' out='{out}'")
    done = subprocess.run(
        [BIN / "flwr", "run", ".", "test", "--run-config", run_config,
         "--federation-config", "num-supernodes=2 client-resources-num-cpus=1", "--stream"],
        cwd=PROJECT_ROOT, env=superlink, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1]
    assert sorted(results["final_epsilon"]) == ["0", "1"]
    assert results["rounds"][0]["failed"] == {} and results["rounds"][0]["rejected"] == {}


def _supernode(env: dict, superlink_port: int, partition: int, tmp_path: Path, tls: TlsFiles) -> subprocess.Popen:
    """A SuperNode that trusts only the deployment's CA, with its own policy on its command
    line (and none in its environment); it releases its N as a DP count (the default)."""
    node_config = (f"partition-id={partition} num-partitions=2 epsilon-budget=100.0 "
                   f"state-dir='{tmp_path}/deployed{partition}'")
    env = {k: v for k, v in env.items() if k != POLICY_ENV}
    return subprocess.Popen(
        [BIN / "flower-supernode", "--root-certificates", str(tls.ca_cert), "--superlink", f"127.0.0.1:{superlink_port}",
         "--port", str(_free_port()), "--node-config", node_config],
        env=env, stdout=(tmp_path / f"node{partition}.log").open("w"), stderr=subprocess.STDOUT,
    )


def test_deployment_with_a_supernode_that_joins_mid_run(tmp_path, shared_data_dir):
    # Prepare: a deployment SuperLink and one SuperNode; the run needs only one client
    out = tmp_path / "out"
    run_config = (f"rounds=3 min-clients=1 limit-train=400 limit-test=300 lot-size=50 noise-multiplier=1.0 "
                  f"data-dir='{shared_data_dir}' out='{out}'")
    tls = write_tls(tmp_path / "certs", ["127.0.0.1"])
    with _superlink(tmp_path, simulation=False, tls=tls) as (env, port):
        nodes = [_supernode(env, port, 0, tmp_path, tls)]
        try:
            run_log = tmp_path / "run.log"
            with run_log.open("w") as log:
                run = subprocess.Popen([BIN / "flwr", "run", ".", "test", "--run-config", run_config, "--stream"],
                                       cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
                # Execute: the second SuperNode connects once round 1 has sampled its clients
                deadline = time.monotonic() + 180
                while "configure_train: 1 of 1" not in run_log.read_text():
                    assert run.poll() is None and time.monotonic() < deadline, run_log.read_text()[-3000:]
                    time.sleep(0.2)
                nodes.append(_supernode(env, port, 1, tmp_path, tls))
                assert run.wait(timeout=240) == 0, run_log.read_text()[-3000:]
        finally:
            for node in nodes:
                _stop(node)
    # Assert: client 1 joined a later round and trained in every round after it
    results = json.loads((out / "results.json").read_text())
    participants = [r["participants"] for r in results["rounds"]]
    assert participants[0] == ["0"] and participants[-1] == ["0", "1"]
    joined = next(i for i, p in enumerate(participants) if "1" in p)
    assert all(p == ["0", "1"] for p in participants[joined:])
    # (ε is not compared: with private sizes each client's q = lot / released N differs)
    assert all(0 < float(eps) < float("inf") for eps in results["final_epsilon"].values())
    assert all(not r["failed"] and not r["rejected"] for r in results["rounds"])
    # each node kept its own durable ledger: the DP count of N, then one entry per round
    for partition, rounds in (("0", 3), ("1", 3 - joined)):
        node = PrivacyLedger.load(tmp_path / f"deployed{partition}" / "ledger.json")
        entries = list(node.entries(partition))
        assert entries[0].startswith("release/num-examples/") and len(entries) == 1 + rounds
        assert node.entries(partition)[entries[0]] == (GaussianEvent(20.0),)


def test_only_registered_supernodes_that_trust_the_ca_join(tmp_path):
    # Prepare: a TLS SuperLink with SuperNode authentication; node 0's key is registered
    tls = write_tls(tmp_path / "certs", ["127.0.0.1"])
    other_ca = write_tls(tmp_path / "other", ["127.0.0.1"])
    keys = {name: write_node_key(tmp_path / "keys", name) for name in ("registered", "unregistered")}
    with _superlink(tmp_path, simulation=False, tls=tls, extra=("--enable-supernode-auth",)) as (env, port):
        register = subprocess.run([BIN / "flwr", "supernode", "register", str(keys["registered"][1]), "test"],
                                  cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert register.returncode == 0, register.stdout + register.stderr

        def node(name, key, ca):
            return subprocess.Popen(
                [BIN / "flower-supernode", "--root-certificates", str(ca), "--superlink", f"127.0.0.1:{port}",
                 "--auth-supernode-private-key", str(key), "--port", str(_free_port()), "--max-retries", "2",
                 "--node-config", "partition-id=0 num-partitions=1"],
                env=env, stdout=(tmp_path / f"{name}.log").open("w"), stderr=subprocess.STDOUT)

        # Execute: the registered node, an unregistered key, and the registered key without the CA
        nodes = {"registered": node("registered", keys["registered"][0], tls.ca_cert),
                 "unregistered": node("unregistered", keys["unregistered"][0], tls.ca_cert),
                 "wrong-ca": node("wrong-ca", keys["registered"][0], other_ca.ca_cert)}
        try:
            refused = {name: nodes[name].wait(timeout=90) for name in ("unregistered", "wrong-ca")}
            listing = subprocess.run([BIN / "flwr", "supernode", "ls", "test", "--format", "json"],
                                     cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        finally:
            for process in nodes.values():
                if process.poll() is None:
                    _stop(process)
    # Assert: both others gave up with an error; only the registered node is online
    assert all(code != 0 for code in refused.values()), refused
    assert "Failed to activate SuperNode" in (tmp_path / "unregistered.log").read_text()
    online = [n for n in json.loads(listing.stdout)["nodes"] if n["status"] == "online"]
    assert len(online) == 1, listing.stdout
