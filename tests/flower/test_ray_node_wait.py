"""Ray's wait for the node it starts to register with its GCS (``RAY_raylet_start_wait_time_s``,
its default 30 s; the 30 s written in ``ray._private.node`` counts only once this wait has
given up) is the wait a busy machine runs out of. ``simulations._ray.ray_cluster`` sets it to
fedpriv's start window, the tests to theirs, scaled (tests/timeouts.py); Ray's driver reads it
from the environment when Ray is imported (its config is read then), which the simulations
leave to ``ray_cluster``.

Ray is replaced in a child program for the first test; the second starts a real
cluster whose raylet is held stopped (SIGSTOP) for ``STALL_S``: with a wait of 1 s the driver
gives up looking for its node and looks again (Ray's ``services.get_node`` raises "GCS cannot
find the node ... Try increase the RAY_raylet_start_wait_time_s config"), which at Ray's
default it would not do before ``STALL_S``; the start then completes."""

import math
import os
import subprocess
import sys

import pytest

from simulations._federated import PROJECT_ROOT
from simulations._ray import NODE_WAIT_ENV, START_TIMEOUT_ENV
from tests.timeouts import scaled

SETTING = """
import importlib.abc, importlib.machinery, os, sys, types
import clients.classic.client_app, server.classic.server_app, simulations._delivery, simulations._flower_private
import simulations.classic, simulations.mnist  # what a simulation imports before ray_cluster
print("Ray imported before ray_cluster:", "ray" in sys.modules, flush=True)
from simulations._ray import NODE_WAIT_ENV, ray_cluster

class FakeRay(importlib.abc.MetaPathFinder, importlib.abc.Loader):  # what ray_cluster's `import ray` runs
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name == "ray" else None

    def create_module(self, spec):
        return None

    def exec_module(self, ray):  # Ray's core reads its config when imported
        print("Ray imported with", os.environ.get(NODE_WAIT_ENV), flush=True)
        ray.init = lambda **kwargs: print("init sees", os.environ.get(NODE_WAIT_ENV), flush=True)
        ray.shutdown = lambda: None
        ray.get_runtime_context = lambda: types.SimpleNamespace(gcs_address="127.0.0.1:1")

sys.meta_path.insert(0, FakeRay())
with ray_cluster({}, {}):
    pass
os.environ[NODE_WAIT_ENV] = "42"
with ray_cluster({}, {}):
    pass
"""

STALL_S = 10
STALLED_START = """
import os, signal, sys, threading
os.environ["RAY_raylet_start_wait_time_s"] = "1"  # before Ray is imported, as ray_cluster sets it
import ray._private.services as services
from simulations._ray import ray_cluster

real_start_raylet, real_get_node, given_up, stalled = services.start_raylet, services.get_node, [], []

def start_raylet(*args, **kwargs):
    info = real_start_raylet(*args, **kwargs)
    if not stalled:  # the first start's only: a retry (ray_cluster's) starts as usual
        stalled.append(info.process.pid)
        os.kill(info.process.pid, signal.SIGSTOP)
        threading.Timer(float(sys.argv[1]), os.kill, (info.process.pid, signal.SIGCONT)).start()
    return info

def get_node(*args, **kwargs):
    try:
        return real_get_node(*args, **kwargs)
    except RuntimeError as err:
        given_up.append(str(err))
        raise

services.start_raylet, services.get_node = start_raylet, get_node
with ray_cluster({}, {}):
    print("started after", len(given_up), "node lookup(s) given up", flush=True)
    for err in given_up:
        print(err, flush=True)
"""


def _without_the_wait() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != NODE_WAIT_ENV}, "PYTHONPATH": str(PROJECT_ROOT)}


def test_a_cluster_fedpriv_starts_waits_its_start_window_for_the_node_unless_told_otherwise():
    window = scaled(300) + 0.5  # a hang guard, whole seconds for Ray
    done = subprocess.run([sys.executable, "-c", SETTING], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=scaled(120), env={**_without_the_wait(), START_TIMEOUT_ENV: str(window)})
    assert done.returncode == 0, done.stderr[-3000:]
    wait = math.ceil(window)
    assert done.stdout.splitlines() == ["Ray imported before ray_cluster: False", f"Ray imported with {wait}",
                                        f"init sees {wait}", "init sees 42"]


@pytest.mark.cluster
def test_rays_driver_waits_for_its_node_as_long_as_the_environment_says():
    done = subprocess.run([sys.executable, "-c", STALLED_START, str(STALL_S)], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=scaled(600), env=_without_the_wait())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (started,) = [line for line in done.stdout.splitlines() if line.startswith("started after")]
    assert int(started.split()[2]) >= 1, done.stdout + done.stderr[-3000:]
    assert "RAY_raylet_start_wait_time_s" in done.stdout
