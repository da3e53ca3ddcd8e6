"""The simulated nodes' Ray workers run at the ServerApp's priority, not Ray's default nice 15
(under which, on a busy machine, describing 3 nodes took 49 s). A real cluster, started by
``simulations._ray.ray_cluster`` in a subprocess (its failures end the process)."""

from __future__ import annotations

import os
import subprocess
import sys

from simulations._ray import WORKER_NICENESS_ENV
from tests.conftest import PROJECT_ROOT
from tests.timeouts import scaled

SCRIPT = """
import os, ray
from simulations._ray import ray_cluster

@ray.remote(num_cpus=0)
def niceness():
    return os.nice(0)

with ray_cluster({}, {}):
    print("driver", os.nice(0), "worker", ray.get(niceness.remote()), flush=True)
"""


def test_ray_workers_run_at_the_drivers_niceness():
    env = {k: v for k, v in os.environ.items() if k != WORKER_NICENESS_ENV}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=scaled(600), env={**env, "PYTHONPATH": str(PROJECT_ROOT)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("driver")]
    _, driver, _, worker = line.split()
    assert worker == driver == str(os.nice(0))
