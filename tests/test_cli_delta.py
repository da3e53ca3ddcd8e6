"""The simulation command checks δ against its nodes' data before Ray starts: δ ≥ 1/N for
the smallest simulated node's N (which allows publishing a record outright) is one
``prog: error`` line naming ``--delta``, exit status 2; δ above 1/(10N) is a warning."""

import os
import subprocess
import sys

import pytest

from fedpriv.data import load_dataset
from fedpriv.federation.partition import Split
from fedpriv.federation.settings import RunSettings
from fedpriv.project import PROJECT_ROOT
from simulations._cli import federated_parser
from simulations._federated import check_delta
from tests.timeouts import scaled


def test_the_issues_command_with_delta_one_half_is_one_line_exit_2(shared_data_dir):
    # 100 records, 2 nodes: about 50 each, so δ = 0.5 ≥ 1/N
    done = subprocess.run([sys.executable, "-m", "simulations.mnist", "--clients", "2", "--delta", "0.5",
                           "--limit-train", "100", "--data-dir", str(shared_data_dir)],
                          cwd=PROJECT_ROOT, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
                          capture_output=True, text=True, timeout=scaled(300))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(lines) == 1 and done.stdout == "", done.stderr[-3000:]  # nothing of Ray or Flower
    assert lines[0].startswith("python -m simulations.mnist: error: argument --delta: 0.5 is >= 1/N")


def _smallest(data_dir, limit: int, clients: int) -> int:
    """The smallest node's N, from the partition rule itself (key 0: --seed 0)."""
    data = load_dataset("mnist", str(data_dir), train=True, limit=limit)
    split = Split(data.features, data.labels, RunSettings().partition, clients, 0.5, key=0)
    return min(len(split.indices(p)) for p in range(clients))


def test_delta_is_refused_at_1_over_n_warned_above_1_over_10n_and_quiet_below(shared_data_dir, capsys):
    n = _smallest(shared_data_dir, 100, 2)
    parser = federated_parser("mnist")

    def check(delta: float) -> None:
        settings = RunSettings.from_run_config({"limit-train": 100, "delta": delta, "data-dir": str(shared_data_dir)})
        check_delta(parser, settings, 2, partition_key=0)

    with pytest.raises(SystemExit) as refused:
        check(1 / n)
    assert refused.value.code == 2 and f"(N = {n})" in capsys.readouterr().err
    check(0.99 / n)
    assert "warning: --delta" in capsys.readouterr().err
    check(0.099 / n)
    assert capsys.readouterr().err == ""
