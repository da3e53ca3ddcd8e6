"""``flwr run .`` against a SuperLink this test starts (loopback only) and always stops."""

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

from simulations._federated import PROJECT_ROOT

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def superlink(tmp_path):
    """A simulation SuperLink on a free loopback port, FLWR_HOME pointing at it."""
    port = _free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    # BIN first on PATH: the SuperLink starts flower-superexec by name, even from an
    # interpreter whose venv is not activated.
    env = {**os.environ, "FLWR_HOME": str(home), "PYTHONPATH": str(PROJECT_ROOT),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = (tmp_path / "superlink.log").open("w")
    process = subprocess.Popen(
        [BIN / "flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess",
         "--host", "127.0.0.1", "--port", str(port), "--database", str(home / "state.db"),
         "--disable-runtime-dependency-installation"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not _healthy(port):
            assert process.poll() is None and time.monotonic() < deadline, "SuperLink did not start"
            time.sleep(0.5)
        yield env
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _healthy(port: int) -> bool:
    try:
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
