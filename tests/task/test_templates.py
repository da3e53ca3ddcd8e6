"""Each template end to end: ``python -m fedpriv new`` writes the app (``template_apps``), then
``python -m simulations.run`` simulates it (2 clients, Ray) in local and in distributed mode:
every client's ε, by its own ledger, within the target, and the test accuracy above the
template's stated ``FLOOR`` (docs/own-task.md)."""

import importlib
import json
import os
import subprocess
import sys

import pytest

from fedpriv.project import PROJECT_ROOT
from fedpriv.templates import TEMPLATES
from tests.timeouts import scaled

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

TARGET = 8.0
MODES = {"local": ["--rounds", "1"], "distributed": ["--privacy", "distributed", "--rounds", "8"]}
"""Local mode runs one round of each template's own plan (RUN_CONFIG: its local epochs, at
the σ for the target over one round); a distributed round is one DP-SGD step (one secure
sum), so it runs 8 of them (about a second each: the run's cost is Ray's start)."""
DISTRIBUTED_LR = {"image": ["--lr", "3"]}
"""The image template's own lr (1) is for its local epochs; a single step per round wants more."""


def simulate(app, out, *flags):
    """``python -m simulations.run --app app`` (2 clients, target ε 8): its results.json."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    command = [sys.executable, "-m", "simulations.run", "--app", str(app), "--clients", "2",
               "--target-epsilon", str(TARGET), "--out", str(out), *flags]
    process = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                             timeout=scaled(900))  # a hang guard
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def floor(template: str) -> float:
    return importlib.import_module(f"fedpriv.templates.{template}").FLOOR


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("template", TEMPLATES)
def test_a_new_app_simulates_within_target_and_above_its_floor(template, mode, template_apps, tmp_path):
    flags = MODES[mode] + (DISTRIBUTED_LR.get(template, []) if mode == "distributed" else [])
    results = simulate(template_apps[template], tmp_path / "out", *flags)
    assert results["privacy"] == mode and results["resolved"]["model"] == "task"
    assert len(results["rounds"]) == results["settings"]["rounds"]
    assert set(results["node_epsilon"]) == {"0", "1"}
    assert all(0 < eps <= TARGET for eps in results["node_epsilon"].values()), results["node_epsilon"]  # own ledger
    assert results["final_accuracy"] >= floor(template), results["final_accuracy"]
