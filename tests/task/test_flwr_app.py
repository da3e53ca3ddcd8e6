"""``flwr run`` of a template app (``python -m fedpriv new``) against a SuperLink this test
starts: Flower builds and installs the app's bundle, its SuperNodes import its ``task.py``
from it, and every node's ε stays within the target."""

import json
import subprocess

import pytest

from fedpriv.new import new_app
from simulations._processes import BIN
from tests.flower.test_flwr_run import _superlink
from tests.timeouts import scaled

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_flwr_run_of_a_new_tabular_app(tmp_path):
    app = new_app(tmp_path / "tabapp", "tabular")
    with _superlink(tmp_path, simulation=True, data_dir=app / "data") as (env, _):
        out = tmp_path / "out"
        run_config = f"rounds=1 min-clients=2 target-epsilon=8.0 data-dir='{app / 'data'}' out='{out}'"
        done = subprocess.run(
            [BIN / "flwr", "run", str(app), "test", "--run-config", run_config,
             "--federation-config", "num-supernodes=2 client-resources-num-cpus=1", "--stream"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(900),
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["resolved"]["model"] == "task" and [r["round"] for r in results["rounds"]] == [1]
    assert sorted(results["final_epsilon"]) == ["0", "1"]
    assert all(0 < eps <= 8.0 for eps in results["final_epsilon"].values())
    assert results["final_accuracy"] >= 0.7  # the majority class alone is 0.63
