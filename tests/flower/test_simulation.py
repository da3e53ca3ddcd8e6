"""End to end through Flower's Ray simulation engine (one run shared by the assertions),
and the single-client run against ``simulations.centralized``."""

import json
import os
import subprocess
import sys

import pytest

from fedpriv.privacy import PrivacyLedger, dpsgd_event, epsilon_of
from fedpriv.training import steps_per_epoch
from simulations._federated import PROJECT_ROOT

pytestmark = pytest.mark.slow

CLIENTS, ROUNDS, TRAIN, LOT, SIGMA, DELTA = 3, 2, 1500, 50, 1.0, 1e-5


def _start(args, **env_vars):
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **env_vars}
    return subprocess.Popen([sys.executable, "-m", *args], cwd=PROJECT_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process, timeout=300):
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


@pytest.fixture(scope="module")
def three_clients(tmp_path_factory, shared_data_dir):
    out = tmp_path_factory.mktemp("sim3")
    _finish(_start(["simulations.mnist", "--clients", str(CLIENTS), "--rounds", str(ROUNDS),
          "--limit-train", str(TRAIN), "--limit-test", "1000", "--lot-size", str(LOT),
          "--noise-multiplier", str(SIGMA), "--delta", str(DELTA), "--seed", "3",
          "--data-dir", str(shared_data_dir), "--out", str(out)]))
    return out, json.loads((out / "results.json").read_text())


def test_learns_above_chance(three_clients):
    out, results = three_clients
    assert [r["round"] for r in results["rounds"]] == [1, 2] and results["stopped"] is None
    assert results["rounds"][-1]["test_accuracy"] > 0.2  # chance is 0.1
    assert (out / "accuracy.png").stat().st_size > 0 and (out / "epsilon.png").stat().st_size > 0
    assert len(results["model_sha256"]) == 64 and results["wall_time_s"] > 0


def test_ledger_epsilon_matches_independent_computation(three_clients):
    out, results = three_clients
    ledger = PrivacyLedger.load(out / "ledger.json")
    n = TRAIN // CLIENTS
    q = LOT / n
    one_round = dpsgd_event(SIGMA, q, steps_per_epoch(q))  # one local epoch per round
    expected = epsilon_of(dpsgd_event(SIGMA, q, ROUNDS * steps_per_epoch(q)), DELTA)
    for client in map(str, range(CLIENTS)):
        assert results["clients"][client]["num_examples"] == n
        assert results["clients"][client]["noise-multiplier"] == SIGMA
        assert ledger.rounds(client) == {r: (one_round,) for r in range(1, ROUNDS + 1)}
        assert ledger.spent(client) == pytest.approx(expected, rel=1e-9)
        assert float(results["final_epsilon"][client]) == pytest.approx(expected, rel=1e-9)


def test_single_client_equals_centralized(tmp_path, shared_data_dir):
    common = ["--seed", "5", "--limit-train", "300", "--lot-size", "30", "--target-epsilon", "3",
              "--data-dir", str(shared_data_dir)]
    fed = _start(["simulations.mnist", "--clients", "1", "--rounds", "2", "--local-epochs", "1",
                  "--out", str(tmp_path / "fed"), *common])
    # The plain commands, as a user would type them: a lone client gets torch's threads.
    central = _start(["simulations.centralized", "--dataset", "mnist", "--epochs", "2", *common])
    central, fed_stdout = json.loads(_finish(central)), _finish(fed)
    results = json.loads((tmp_path / "fed" / "results.json").read_text())
    assert results["model_sha256"] == central["model_sha256"], fed_stdout[-2000:]
    assert float(results["final_epsilon"]["0"]) == pytest.approx(central["epsilon"], rel=1e-9)
    assert results["clients"]["0"]["noise-multiplier"] == central["noise_multiplier"]
