"""CIFAR-10 end to end: ``python -m simulations.cifar`` on tiny files in CIFAR-10's format.

The Ray workers are fresh processes, so torchvision's md5 table is pointed at the test's
files by a ``sitecustomize`` on PYTHONPATH; the production loader keeps its checks. Every
Python process of the run reads it, Ray's own included, so it imports nothing itself: it
patches torchvision's CIFAR module when (if) a process imports that. (Importing torchvision
there cost each of Ray's processes torch's import: on a busy machine Ray's dashboard agent
then took about 60 s to start, past the raylet's fixed 15 s for it, and Ray failed to start.)
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cifar_files import md5_tables, write_cifar10
from tests.timeouts import scaled

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]

SITECUSTOMIZE = """
import importlib.abc, importlib.util, json, os, sys

class PointCifarAtTheTestFiles(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torchvision.datasets.cifar":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            for key, value in json.loads(os.environ["FEDPRIV_TEST_CIFAR_MD5"]).items():
                setattr(module.CIFAR10, key, value)

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, PointCifarAtTheTestFiles())
"""


def test_cifar_simulation_runs_end_to_end(tmp_path):
    _, md5 = write_cifar10(tmp_path / "data", per_batch=40)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), str(ROOT)]),
           "FEDPRIV_TEST_CIFAR_MD5": json.dumps(md5_tables(md5))}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "simulations.cifar", "--clients", "2", "--rounds", "1",
         "--lot-size", "20", "--noise-multiplier", "1.0", "--data-dir", str(tmp_path / "data"),
         "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(1200),  # a hang guard
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["dataset"] == "cifar10"
    assert len(results["rounds"]) == 1
    assert sorted(results["final_epsilon"]) == ["0", "1"]
    assert all(0 < float(eps) < float("inf") for eps in results["final_epsilon"].values())
    assert (out / "accuracy.png").exists() and (out / "epsilon.png").exists()
