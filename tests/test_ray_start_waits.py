"""The cluster tests raise Ray's own start-up waits with the timeout scale: every process of
the session (Ray's included) finds them in its environment, and Ray reads them."""

import os
import subprocess
import sys

from tests.timeouts import RAY_START_WAITS, ray_start_waits


def test_the_waits_scale_and_the_session_sets_them(monkeypatch):
    assert all(os.environ[name] == value for name, value in ray_start_waits().items())
    monkeypatch.setenv("FEDPRIV_TEST_TIMEOUT_SCALE", "3")
    assert ray_start_waits() == {name: str(3 * seconds) for name, seconds in RAY_START_WAITS.items()}


def test_ray_reads_them():
    """Ray's config in a child process, which inherits the session's environment."""
    done = subprocess.run([sys.executable, "-c", "from ray._raylet import Config; "
                           "print(Config.worker_register_timeout_seconds(), Config.py_gcs_connect_timeout_s())"],
                          capture_output=True, text=True, check=True)
    waits = ray_start_waits()
    expected = [int(waits[f"RAY_{name}"]) for name in ("worker_register_timeout_seconds", "py_gcs_connect_timeout_s")]
    assert [int(value) for value in done.stdout.split()] == expected
