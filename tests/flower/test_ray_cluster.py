"""``--ray-address`` against a real Ray cluster (a head and a worker, separate processes on
loopback), and Ray failing to start: one line and a non-zero exit, never a hang. Limits are
hang guards (tests/timeouts.py)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from simulations._federated import PROJECT_ROOT
from simulations._processes import BIN, free_port
from tests.timeouts import scaled

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
SMALL_RUN = ["--clients", "2", "--rounds", "1", "--limit-train", "200", "--limit-test", "100",
             "--noise-multiplier", "1"]


def _ray_pids(marker: str) -> list[int]:
    done = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return [int(pid) for pid in done.stdout.split() if int(pid) != os.getpid()]


def _stop_cluster(marker: str) -> None:
    """Stop, by PID, every Ray process of the cluster whose temp folder is ``marker``. Ray's
    GCS, raylets and autoscaler monitor outlive a SIGTERM (still there 12 s later, here), so
    each gets 2 s to exit on it before the SIGKILL, which has 10 s to take effect."""
    for sig, grace in ((signal.SIGTERM, 2), (signal.SIGKILL, 10)):
        for pid in _ray_pids(marker):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while _ray_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.2)


def _active_nodes(port: int, env: dict) -> int:
    """How many nodes ``ray status`` lists as active in the cluster at ``port``."""
    status = subprocess.run([BIN / "ray", "status", "--address", f"127.0.0.1:{port}"], env=env,
                            capture_output=True, text=True, timeout=scaled(300)).stdout
    active = status.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return active.count(" node_")


def test_simulation_on_a_ray_cluster_of_two_nodes(tmp_path, shared_data_dir):
    # Prepare: `ray start --head` and one `ray start --address` worker, 1 CPU each, on loopback
    temp = tempfile.mkdtemp(prefix="fpray", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    try:
        for command in ([BIN / "ray", "start", "--head", "--port", str(port), "--temp-dir", temp,
                         "--include-dashboard=false", *common],
                        [BIN / "ray", "start", "--address", f"127.0.0.1:{port}", *common]):
            started = subprocess.run(command, env=env, capture_output=True, text=True, timeout=scaled(300))
            assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        deadline = time.monotonic() + scaled(300)
        while (nodes := _active_nodes(port, env)) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        # Execute: the simulation joins the cluster; its two clients need one CPU each
        done = subprocess.run([sys.executable, "-m", "simulations.mnist", *SMALL_RUN, "--cpus-per-client", "1",
                               "--data-dir", str(shared_data_dir), "--out", str(tmp_path / "out"),
                               "--ray-address", f"127.0.0.1:{port}"],
                              cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=scaled(900))
    finally:
        _stop_cluster(temp)
        shutil.rmtree(temp, ignore_errors=True)
    # Assert: two nodes in the cluster, a finished run, no Ray process of it left
    assert nodes == 2
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["rounds"][0]["participants"] == ["0", "1"] and not results["rounds"][0]["failed"]
    assert _ray_pids(temp) == []


@pytest.mark.parametrize("flags, env, message", [
    (["--ray-address", "127.0.0.1:{port}"], {}, "no Ray cluster answers at 127.0.0.1:"),
    ([], {"FEDPRIV_RAY_START_TIMEOUT": "0.01"}, "Ray did not start within 0.01 s"),
])
def test_ray_that_does_not_start_ends_the_run_with_one_line(tmp_path, shared_data_dir, flags, env, message):
    flags = [f.format(port=free_port()) for f in flags]
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "simulations.mnist", *SMALL_RUN, "--data-dir", str(shared_data_dir),
                           "--out", str(tmp_path / "out"), *flags],
                          cwd=PROJECT_ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=scaled(300))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert errors == [f"python -m simulations.mnist: error: {errors[0].split('error: ', 1)[1]}"]
    assert message in errors[0]
    assert time.monotonic() - start < scaled(120)  # the interpreter's start and imports; never a hang
    assert not (Path(tmp_path / "out") / "results.json").exists()


def test_a_ray_cluster_that_dies_mid_run_ends_it_with_one_line():
    # Prepare: a program that starts Ray as the simulations do, then kills Ray's GCS (saying
    # when, on the machine's monotonic clock) and waits
    program = (
        "import os, signal, time\n"
        "from simulations._processes import descendants\n"
        "from simulations._ray import ray_cluster\n"
        "with ray_cluster({}, {}):\n"
        "    for pid in descendants(os.getpid()):\n"
        "        if 'gcs_server' in open(f'/proc/{pid}/cmdline').read():\n"
        "            os.kill(pid, signal.SIGKILL)\n"
        "    print('killed at', time.monotonic(), flush=True)\n"
        "    time.sleep(600)\n"
        "print('not reached')\n"
    )
    # Execute
    done = subprocess.run([sys.executable, "-c", program], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=scaled(900))
    ended = time.monotonic()
    # Assert: the watchdog ended it soon after the kill (three 5-s checks), with one error line
    assert done.returncode == 1 and "not reached" not in done.stdout
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "stopped answering; the run is incomplete" in errors[0], done.stderr[-2000:]
    killed = float(done.stdout.split("killed at", 1)[1].split()[0])
    assert ended - killed < scaled(60)
