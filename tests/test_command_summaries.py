"""What the commands print for a newcomer to judge: the federated run's summary (the trained
model's accuracy only, ε beside its target, every file in ``--out``), ``--out`` holding an
earlier run's results refused in one line, and the one-result commands' summary lines
before (or, with ``--out``, instead of) their JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulations import classic, dpdropout, dppca
from simulations._federated import summary
from simulations._summary import report
from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[1]


def _results(rounds: list[dict], final_accuracy: float | None, target: float | None = 2.0) -> dict:
    return {"rounds": rounds, "stopped": None if rounds else "round 1: no client can afford another round",
            "resolved": {"model": "scatter_linear", "accountant": "rdp", "delta": 1e-5},
            "settings": {"target_epsilon": target}, "final_accuracy": final_accuracy,
            "initial": {"test_accuracy": 0.1293}, "final_epsilon": {"0": 1.9892, "1": 1.9892, "2": 1.9892},
            "wall_time_s": 48.0, "simulation_wall_time_s": 55.1, "model_sha256": "ab" * 32, "randomness": "seeded"}


def test_the_summary_gives_the_trained_accuracy_the_target_and_every_file(tmp_path):
    for name in ("results.json", "ledger.json", "accuracy.png", "epsilon.png", "run.log"):
        (tmp_path / name).write_text("x")
    lines = summary(_results([{"round": 1}], 0.9607), tmp_path).splitlines()
    assert "test accuracy: 96.07 %" in lines
    assert ("ε per client (rdp, δ = 1e-05, target 2): 3 clients, min 1.9892, median 1.9892, max 1.9892"
            " (node randomness: seeded)") in lines
    written = lines[-1].removeprefix(f"written to {tmp_path}: ").split(", ")
    assert sorted(written) == sorted(os.listdir(tmp_path))


def test_no_round_trained_reports_no_accuracy(tmp_path):
    """The initial model's 12.93 % is not the run's result."""
    text = summary(_results([], None), tmp_path)
    assert "test accuracy: none, no round was trained" in text and "12.93" not in text
    assert "target" not in summary(_results([], None, target=None), tmp_path)


def test_an_out_folder_with_results_is_refused_in_one_line(tmp_path, shared_data_dir):
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "ledger.json").write_text("{}")
    done = subprocess.run([sys.executable, "-m", "simulations.mnist", "--clients", "2", "--rounds", "1",
                           "--limit-train", "600", "--data-dir", str(shared_data_dir), "--out", str(tmp_path)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=scaled(300))
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == (f"python -m simulations.mnist: error: argument --out: {tmp_path} already holds a run's "
                    "results (ledger.json, results.json): choose another --out, or remove them")
    assert sorted(os.listdir(tmp_path)) == ["ledger.json", "results.json"]  # nothing touched


CLASSIC = {"algorithm": "linreg", "epsilon": 2.0, "clients": 2, "metric_name": "test_mse", "metric": 4857.15,
           "nonprivate_metric": 3247.83, "diffprivlib_metric": 9148808746.58,
           "client_epsilon": {"1": 2.0000000005, "0": 2.0000000005}}


@pytest.mark.parametrize("module, result, expected", [
    (classic, CLASSIC, ["linreg on diabetes, ε = 2 per record, across 2 Flower clients",
                        "test mse: 4857 (non-private 3248, diffprivlib 9.149e+09)",
                        "ε per client (each node's ledger, δ = 1e-05): 0: 2.0000, 1: 2.0000"]),
    (classic, {**CLASSIC, "algorithm": "ann-iris", "clients": 1, "metric_name": "test_accuracy", "metric": 0.9,
               "nonprivate_metric": 0.96, "diffprivlib_metric": None, "client_epsilon": {"0": 1.9994}},
     ["ann-iris on iris, ε = 2 per record, centralized",
      "test accuracy: 90.00 % (non-private 96.00 %, diffprivlib n/a)",
      "ε per client (ledger, δ = 1e-05): 0: 1.9994"]),
    (dppca, {"accuracy": 0.9512, "epsilon": 2.0, "delta": 1e-5, "pca_epsilon": 0.2975, "client_epsilon":
             {"0": 1.99}, "clients": 1, "training": "central", "dims": 60, "epochs": 30},
     ["DP-PCA to 60 dimensions + MLP on MNIST, 30 epochs, centralized, ε = 2 (the PCA's 0.2975)",
      "test accuracy: 95.12 %", "ε per client (ledger, δ = 1e-05): 0: 1.9900"]),
    (dpdropout, {"dataset": "digits", "method": "dpd", "epsilon": 1.0, "delta": 1e-4, "accountant": "rdp",
                 "noise_multiplier": 3.23, "accuracy": 0.65, "epochs": 2, "clients": 3,
                 "client_epsilon": {str(c): 0.997 for c in range(12)}},
     ["dpd on digits, 2 epochs, FedAvg across 3 Flower clients, ε = 1, σ = 3.23 (calibrated by rdp)",
      "test accuracy: 65.00 %",
      "ε per client (each node's ledger, rdp, δ = 0.0001): 12 clients, min 0.9970, median 0.9970, max 0.9970"]),
])
def test_summary_lines(module, result, expected):
    assert module.summary_lines(result) == expected


def test_report_prints_the_json_last_or_writes_it_instead(tmp_path, capsys):
    report(["a summary"], CLASSIC, None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "a summary" and json.loads(lines[-1]) == CLASSIC
    out = tmp_path / "r.json"
    report(["a summary"], CLASSIC, out)
    assert capsys.readouterr().out.splitlines() == ["a summary", f"written: {out}"]
    assert json.loads(out.read_text()) == CLASSIC


def test_the_deployment_prints_accuracy_and_each_nodes_epsilon_beside_the_target(tmp_path):
    from simulations.deployment import summary as deployment_summary

    for name in ("results.json", "ledger.json", "nodes.json", "run.log"):
        (tmp_path / name).write_text("x")
    for folder in ("app", "certs", "nodes", "server"):
        (tmp_path / folder).mkdir()
    results = {"rounds": [{"round": 1}, {"round": 2}], "stopped": None, "final_accuracy": 0.931,
               "final_epsilon": {"0": 0.9876, "1": 0.9801}}
    nodes = {"0": {"epsilon": 0.9876, "entries": ["a", "b", "c"]}, "1": {"epsilon": 0.9801, "entries": ["a", "b"]}}
    lines = deployment_summary(results, nodes, 1.0, tmp_path).splitlines()
    assert lines[0] == "rounds run: 2, test accuracy: 93.10 %"
    assert lines[1] == "node 0: ε = 0.9876 of target 1 in its own ledger (3 entries); the server's ledger: ε = 0.9876"
    assert lines[2] == "node 1: ε = 0.9801 of target 1 in its own ledger (2 entries); the server's ledger: ε = 0.9801"
    written = lines[3].removeprefix(f"written to {tmp_path}: ").split(";")[0].split(", ")
    assert sorted(written) == sorted(p.name + "/" * p.is_dir() for p in tmp_path.iterdir())
    reason = "round 1: no client can afford another round"
    stopped = {**results, "rounds": [], "final_accuracy": None, "stopped": reason}
    assert deployment_summary(stopped, nodes, 1.0, tmp_path).splitlines()[0] == (
        f"rounds run: 0 (stopped: {reason}), test accuracy: none, no round was trained")
