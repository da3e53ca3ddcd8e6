"""End to end through Flower's Ray simulation engine: two runs on one state dir (the
second finds every budget spent and stops before Ray starts), what the first printed, and
the single-client run against ``simulations.centralized``."""

import json
import os
import re
import subprocess
import sys

import dp_accounting
import pytest

from fedpriv.dpsgd import steps_per_epoch
from fedpriv.federation import protocol
from fedpriv.models import build_model, model_sha256
from fedpriv.privacy import PrivacyLedger, dpsgd_event
from simulations._federated import PROJECT_ROOT
from tests.timeouts import scaled

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CLIENTS, ROUNDS, TARGET, DELTA = 2, 2, 2.0, 1e-5


def _start(args, **env_vars):
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **env_vars}
    return subprocess.Popen([sys.executable, "-m", *args], cwd=PROJECT_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process, timeout=900):
    try:
        stdout, stderr = process.communicate(timeout=scaled(timeout))  # a hang guard
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def _command(state, out, data_dir, seed):
    return ["simulations.mnist", "--clients", str(CLIENTS), "--rounds", str(ROUNDS), "--target-epsilon", str(TARGET),
            "--limit-train", "600", "--limit-test", "1000", "--data-dir", str(data_dir), "--state-dir", str(state),
            "--out", str(out), "--seed", seed]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, shared_data_dir):
    """The issue's command twice on one state dir, the second time with another seed: the
    first run's (results, stdout, stderr); the second's (exit status, stdout, stderr)."""
    root = tmp_path_factory.mktemp("sim")
    state = root / "state"
    first = _start(_command(state, root / "out0", shared_data_dir, "0"))
    try:
        stdout, stderr = first.communicate(timeout=scaled(300))
    finally:
        first.kill()
    assert first.returncode == 0, stdout[-3000:] + stderr[-3000:]
    results = json.loads((root / "out0" / "results.json").read_text())
    first_ledgers = {path: path.read_bytes() for path in sorted(state.rglob("ledger.json"))}
    second = _start(_command(state, root / "out1", shared_data_dir, "1"))
    try:
        out, err = second.communicate(timeout=scaled(300))
    finally:
        second.kill()
    return state, ((results, stdout, stderr), (second.returncode, out, err)), first_ledgers


def test_learns_every_round(two_runs):
    # At seed 0 (seeded nodes: reproducible) the run went 0.118 -> 0.236 -> 0.453 in test
    # accuracy and 2.55 -> 2.12 -> 1.79 in loss; a model that does not move, moves the wrong
    # way or is averaged wrongly stays near the initial 0.12 (chance is 0.1).
    _, ((results, _, _), _), _ = two_runs
    assert [r["round"] for r in results["rounds"]] == [1, 2] and results["stopped"] is None
    accuracy = [results["initial"]["test_accuracy"]] + [r["test_accuracy"] for r in results["rounds"]]
    loss = [results["initial"]["test_loss"]] + [r["test_loss"] for r in results["rounds"]]
    assert accuracy[0] < accuracy[1] < accuracy[2] and accuracy[2] > 0.35, accuracy
    assert loss[0] > loss[1] > loss[2], loss
    assert results["final_accuracy"] == accuracy[2]
    initial = model_sha256(build_model(results["resolved"]["model"], 0))
    assert len(results["model_sha256"]) == 64 and results["model_sha256"] != initial and results["wall_time_s"] > 0


def test_each_client_ends_within_its_target_and_close_to_it(two_runs):
    # calibration spends the target (σ to 3 significant digits, rounded up), never more
    _, ((results, _, _), _), _ = two_runs
    assert sorted(results["final_epsilon"]) == [str(c) for c in range(CLIENTS)]
    assert all(0.95 * TARGET <= float(e) <= TARGET for e in results["final_epsilon"].values())


def test_ledgers_match_an_independent_computation(two_runs):
    state, ((results, _, _), _), _ = two_runs
    server = PrivacyLedger.load(state / "ledger.json")
    for client in map(str, range(CLIENTS)):
        sigma = results["clients"][client]["noise-multiplier"]
        q = results["clients"][client]["shared-sample-rate"]
        steps = steps_per_epoch(q)  # one local epoch per round
        expected = [protocol.train_entry(results["run_key"], r) for r in range(1, ROUNDS + 1)]
        node = PrivacyLedger.load(state / "nodes" / client / "ledger.json")
        for ledger in (server, node):
            assert list(ledger.entries(client)) == expected
            assert ledger.events(client) == (dpsgd_event(sigma, q, steps),) * ROUNDS
            assert ledger.spent_at(client, DELTA) == pytest.approx(_dp_accounting(sigma, q, ROUNDS * steps), rel=1e-6)
            assert ledger.spent_at(client, DELTA) <= TARGET
        assert float(results["final_epsilon"][client]) == pytest.approx(server.spent(client), rel=1e-12)


def test_a_second_run_on_spent_budgets_stops_before_ray_and_changes_no_ledger(two_runs):
    state, (_, (code, stdout, stderr)), first_ledgers = two_runs
    lines = stderr.strip().splitlines()
    assert code == 1 and stdout == "" and len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("python -m simulations.mnist: nothing left to spend: ")
    assert "server's ledger" in lines[0] and "--epsilon-budget" in lines[0] and str(state) in lines[0]
    assert "Ray" not in stderr  # its start says "Started a local Ray instance"
    assert not (state.parent / "out1").exists()  # no result, so not the initial model's accuracy either
    assert {path: path.read_bytes() for path in first_ledgers} == first_ledgers


def test_the_first_run_says_what_it_wrote_and_hides_notices(two_runs):
    state, ((results, stdout, stderr), _), _ = two_runs
    out = state.parent / "out0"
    written = re.search(r"^written to (.+): (.+)$", stdout, re.MULTILINE)
    assert written and written.group(1) == str(out)
    assert sorted(written.group(2).split(", ")) == sorted(p.name for p in out.iterdir())  # ledger.json too
    assert {"results.json", "ledger.json", "accuracy.png", "epsilon.png", "run.log"} <= set(os.listdir(out))
    assert f"test accuracy: {100 * results['final_accuracy']:.2f} %" in stdout
    assert f"target {TARGET:g})" in stdout
    assert "\x1b[" not in stdout + stderr  # a pipe is no terminal: no colour codes
    for notice in ("DEPRECATED FEATURE", "Manually terminating", "In future versions of Ray"):
        assert notice not in stdout + stderr
    assert "Discovery: " in (out / "run.log").read_text()  # Flower's records are in the log file too


def _dp_accounting(sigma, q, steps):
    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(DELTA)


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
