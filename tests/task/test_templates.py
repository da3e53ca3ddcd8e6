"""Each template end to end: ``python -m fedpriv new`` writes the app, then
``python -m simulations.run`` simulates it (2 clients, Ray): every client's ε, by its own
ledger, within the target, and the test accuracy above the template's stated ``FLOOR``."""

import importlib
import json
import os
import subprocess
import sys

import pytest

from fedpriv.__main__ import main as fedpriv_main
from fedpriv.project import PROJECT_ROOT
from tests.timeouts import scaled

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

TARGET = 8.0
DISTRIBUTED_FLOOR = 0.75
"""The tabular app's floor in distributed mode: 8 single DP-SGD steps (a round is one step)."""


def _simulate(app, out, *flags):
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    command = [sys.executable, "-m", "simulations.run", "--app", str(app), "--clients", "2",
               "--target-epsilon", str(TARGET), "--out", str(out), *flags]
    process = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                             timeout=scaled(900))  # a hang guard
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def _check(results, floor):
    assert len(results["rounds"]) == results["settings"]["rounds"]
    assert set(results["node_epsilon"]) == {"0", "1"}
    assert all(0 < eps <= TARGET for eps in results["node_epsilon"].values()), results["node_epsilon"]  # own ledger
    assert results["resolved"]["model"] == "task"
    assert results["final_accuracy"] >= floor, results["final_accuracy"]


@pytest.mark.parametrize("template", ["tabular", "image", "text"])
def test_a_new_app_simulates_within_target_and_above_its_floor(template, tmp_path):
    app = fedpriv_main(["new", str(tmp_path / template), "--template", template])
    assert (app / "task.py").is_file() and 'task = "task"' in (app / "pyproject.toml").read_text()
    _check(_simulate(app, tmp_path / "out"), importlib.import_module(f"fedpriv.templates.{template}").FLOOR)


def test_the_tabular_app_in_distributed_mode(tmp_path):
    app = fedpriv_main(["new", str(tmp_path / "tabular"), "--template", "tabular"])
    results = _simulate(app, tmp_path / "out", "--privacy", "distributed", "--rounds", "8")
    assert results["privacy"] == "distributed"
    _check(results, DISTRIBUTED_FLOOR)
