"""``benchmarks.distributed --from``: earlier reports merged into one table, JSON and figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import distributed


def _report(path: Path, partition: str, clients: int, accuracy: float, epsilon: float = 2.0) -> Path:
    point = {"clients": clients, "epsilon": epsilon, "noise_multiplier": 9.39, "steps": 40, "seconds": 1.0}
    path.write_text(json.dumps({
        "target_epsilon": epsilon, "delta": 1e-5, "epochs": 40, "limit_train": 6000, "partition": partition,
        "alpha": 0.5 if partition == "dirichlet" else None,
        "points": [{**point, "mode": "centralized", "clients": 1, "accuracy": 0.9},
                   {**point, "mode": "distributed", "accuracy": accuracy}]}))
    return path


def test_reports_merge_with_each_points_partition(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    iid = _report(tmp_path / "a.json", "iid", 10, 0.91)
    dirichlet = _report(tmp_path / "b.json", "dirichlet", 100, 0.92)
    out, plot = tmp_path / "m.json", tmp_path / "m.png"
    distributed.main(["--from", str(iid), str(dirichlet), "--out", str(out), "--plot", str(plot)])
    points = json.loads(out.read_text())["points"]
    assert [(p["mode"], p["clients"], p["partition"]) for p in points] == [
        ("centralized", 1, "-"), ("distributed", 10, "iid"), ("centralized", 1, "-"),
        ("distributed", 100, "dirichlet 0.5")]
    assert "dirichlet 0.5" in capsys.readouterr().out
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_reports_of_different_budgets_are_not_merged(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="differ"):
        distributed.main(["--from", str(_report(tmp_path / "a.json", "iid", 10, 0.9)),
                          str(_report(tmp_path / "b.json", "iid", 10, 0.9, epsilon=3.0)), "--out", str(tmp_path / "m")])
