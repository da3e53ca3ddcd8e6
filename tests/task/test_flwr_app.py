"""``flwr run`` of each template app (``python -m fedpriv new``) against one SuperLink this
module starts: Flower builds and installs each app's bundle, its SuperNodes import its
``task.py`` from it, every node's ε stays within the target and the test accuracy above
the template's ``FLOOR``. One SuperLink serves the three runs (each its own run id); its
simulated nodes' policy names one data folder holding the three templates' data."""

import json
import shutil
import subprocess

import pytest

from fedpriv.templates import TEMPLATES
from simulations._processes import BIN
from tests.flower.test_flwr_run import _superlink
from tests.task.test_templates import floor
from tests.timeouts import scaled

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(scope="module")
def superlink(template_apps, tmp_path_factory):
    """A simulation SuperLink whose nodes hold every template's data (their file names differ)."""
    root = tmp_path_factory.mktemp("superlink")
    for app in template_apps.values():
        shutil.copytree(app / "data", root / "data", dirs_exist_ok=True)
    with _superlink(root, simulation=True, data_dir=root / "data") as (env, _):
        yield env


@pytest.mark.parametrize("template", TEMPLATES)
def test_flwr_run_of_a_new_app(template, template_apps, superlink, tmp_path):
    app, out = template_apps[template], tmp_path / "out"
    run_config = f"rounds=1 min-clients=2 target-epsilon=8.0 data-dir='{app / 'data'}' out='{out}'"
    done = subprocess.run(
        [BIN / "flwr", "run", str(app), "test", "--run-config", run_config,
         "--federation-config", "num-supernodes=2 client-resources-num-cpus=1", "--stream"],
        cwd=tmp_path, env=superlink, capture_output=True, text=True, timeout=scaled(900),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["resolved"]["model"] == "task" and [r["round"] for r in results["rounds"]] == [1]
    assert sorted(results["final_epsilon"]) == ["0", "1"]
    assert all(0 < eps <= 8.0 for eps in results["final_epsilon"].values())
    assert results["final_accuracy"] >= floor(template), results["final_accuracy"]
