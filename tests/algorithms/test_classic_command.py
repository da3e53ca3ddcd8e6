"""``python -m simulations.classic``: the JSON the issue asks for, with each client's ε read
from a ledger, centralized and across Flower clients; the summary printed before it, and
(across clients) no notice or colour code of Flower's or Ray's on the terminal."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import dp_accounting
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from simulations._federated import PROJECT_ROOT
from tests.timeouts import scaled

KEYS = {"algorithm", "epsilon", "clients", "metric_name", "metric", "nonprivate_metric", "diffprivlib_metric",
        "client_epsilon", "randomness"}


def _run(*argv: str) -> dict:
    """The JSON of a run: from ``--out`` where given (stdout's last line names it), else stdout's last line;
    no log left in the temporary folder."""
    process = subprocess.Popen([sys.executable, "-m", "simulations.classic", *argv], cwd=PROJECT_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=scaled(1200))  # a hang guard
    finally:
        process.kill()  # a no-op once it has exited; nothing the test starts outlives it
        process.wait()
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # its own log (named by its pid: other tests' runs may be writing theirs meanwhile) is gone
    assert not (Path(tempfile.gettempdir()) / f"fedpriv-simulations.classic-{process.pid}.log").exists()
    assert "log: " not in done.stdout or "--out" in argv
    last = done.stdout.strip().splitlines()[-1]
    if "--out" in argv:
        out = argv[argv.index("--out") + 1]
        assert last == f"written: {out}"
        return json.loads(Path(out).read_text())
    result = json.loads(last)
    shown = done.stdout + done.stderr
    assert f"ε = {result['epsilon']:g} per record" in shown  # the summary, before the JSON
    assert "\x1b[" not in shown  # pipes are no terminal: no colour codes
    for notice in ("DEPRECATED FEATURE", "Manually terminating", "In future versions of Ray"):
        assert notice not in shown
    return result


@pytest.mark.parametrize("algorithm, name, spent", [
    ("linreg", "test_mse", 0.5), ("kmeans-dplloyd", "clustering_accuracy", 0.5),
    ("kmeans-input", "clustering_accuracy", 0.5), ("ann-iris", "test_accuracy", 0.5),
    ("output-perturbation", "test_accuracy", None),  # ε 0.5 per answer, 30 test records answered
])
def test_centralized_json(algorithm, name, spent, tmp_path):
    out = tmp_path / "r.json"
    result = _run(algorithm, "--epsilon", "0.5", "--out", str(out))
    assert set(result) == KEYS and json.loads(out.read_text()) == result
    assert result["metric_name"] == name and result["clients"] == 1 and result["randomness"] == "seeded"
    # diffprivlib has a model of this kind for the regression and k-means, none for the networks
    has_peer = algorithm in ("linreg", "kmeans-dplloyd", "kmeans-input")
    assert isinstance(result["diffprivlib_metric"], float) == has_peer
    if spent is None:  # 30 pure releases: the tighter of dp-accounting's RDP bound at δ and their sum
        spent = min(_rdp_epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1 / 0.5), 30)),
                    0.5 * 30)
    assert 0.97 * spent <= result["client_epsilon"]["0"] <= spent * (1 + 1e-6)  # RDP calibration may land under


def _rdp_epsilon(event: dp_accounting.DpEvent, delta: float = 1e-5) -> float:
    accountant = rdp_privacy_accountant.RdpAccountant()
    return accountant.compose(event).get_epsilon(delta)


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("algorithm, spent", [("linreg", 2.0), ("ann-iris", 2.0)])
def test_federated_across_two_flower_clients(algorithm, spent):
    result = _run(algorithm, "--epsilon", "2", "--clients", "2")
    assert result["clients"] == 2 and sorted(result["client_epsilon"]) == ["0", "1"]
    # each node's own ledger: Laplace releases compose exactly; DP-SGD's σ is calibrated to land at or under ε
    assert all(0.97 * spent <= eps <= spent * (1 + 1e-6) for eps in result["client_epsilon"].values())
    if algorithm == "linreg":
        assert 0 < result["metric"] < 3 * result["nonprivate_metric"]
    else:  # chance is 1/3
        assert result["metric"] > 0.4
