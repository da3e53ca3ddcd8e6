"""A Ray start that times out on a busy machine ("The current node timed out during
startup": its raylet took longer than Ray's fixed 30 s to register) is retried once, the
failed start's processes stopped; a second such failure ends the run with one line.

Ray's ``init`` is replaced in a child program (the failure path exits the process) by one
that starts a process, as the real one starts its GCS and raylet, then times out."""

import subprocess
import sys
import textwrap

import pytest

from simulations._federated import PROJECT_ROOT
from simulations._processes import start_time
from tests.timeouts import scaled

PROGRAM = textwrap.dedent("""
    import subprocess, sys, ray
    from simulations._ray import ray_cluster

    failures, children = int(sys.argv[1]), []

    def init(**kwargs):
        if len(children) < failures:
            children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
            print("started", children[-1].pid, flush=True)
            raise Exception("The current node timed out during startup. This could happen because some of "
                            "the raylet failed to startup or the GCS has become overloaded.")

    ray.init, ray.shutdown = init, lambda: None
    ray.get_runtime_context = lambda: type("Context", (), {"gcs_address": "127.0.0.1:1"})()
    with ray_cluster({}, {}):
        print("running after", len(children), "failed start(s); the first's process ended with",
              children[0].wait(timeout=30), flush=True)
""")


@pytest.mark.parametrize("failures", [1, 2])
def test_a_ray_start_that_timed_out_is_retried_once(failures):
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(failures)], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=scaled(120))
    started = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("started ")]
    assert len(started) == failures
    assert all(start_time(pid) is None for pid in started)  # each failed start's process is gone
    if failures == 1:  # the retry started Ray
        assert done.returncode == 0, done.stderr[-3000:]
        assert "running after 1 failed start(s); the first's process ended with -9" in done.stdout
    else:  # one line, exit 1
        assert done.returncode == 1 and "running after" not in done.stdout
        errors = [line for line in done.stderr.splitlines() if "error:" in line]
        assert [line.split(": error: ", 1)[1] for line in errors] == [
            "Ray failed to start: The current node timed out during startup. This could happen because some of the "
            "raylet failed to startup or the GCS has become overloaded."]
