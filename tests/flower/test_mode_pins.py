"""A regression pin of every privacy mode (issue 34): for a fixed seed and tiny settings, a
run in process (``server.run.run_server`` against the real ClientApp) gives the same
``results.json``, the same ledgers (server's and each node's) and the same ``model_sha256``
as the code had when the pins were recorded.

Why a pinned output, when tests otherwise check against an independent reference: the
refactor of issue 34 (one round loop, one release template, one settings model) must not
change behaviour, and "the same as before" has no reference other than the code before.
The other tests say what the numbers should be; these say they did not move. A change of
behaviour that is meant re-records them, and its commit says why:
``python -m tests.flower.test_mode_pins`` rewrites ``mode_pins.json``.

The model's floats depend on the CPU's kernels (torch's ISA and thread count), so the runs
use one torch thread and the pins record the platform they were taken on: on another, the
model-dependent fields (``MODEL_FIELDS``, ``model_sha256``) are not compared; the ledgers,
cohorts, plans and ε still are, exactly.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Any

import pytest

PINS = Path(__file__).with_name("mode_pins.json")
NODES = 3
DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
COMMON = {"rounds": 2, "min-clients": NODES, "limit-train": 60, "limit-test": 40, "model": "cnn", "seed": 7,
          "lot-size": 10, "lr": 0.1, "noise-multiplier": 1.0, "epsilon-budget": 100.0}
MODES: dict[str, dict[str, Any]] = {
    "local": {"privacy": "local"},
    "distributed": {"privacy": "distributed"},
    "user-central": {"privacy": "user", "cohort": 2, "user-clip": 0.05, "clip-quantile": 0.5,
                     "clip-count-noise": 2.0, "server-randomness": "seeded"},
    "user-distributed": {"privacy": "user", "user-noise": "distributed", "cohort": 2, "user-clip": 0.05,
                         "server-randomness": "seeded"},
}
POLICY = {"epsilon-budget": 100.0, "public-num-examples": True, "randomness": "seeded", "allow-distributed": True,
          "allow-central-user": True, "min-cohort": 2}
VOLATILE = ("wall_time_s", "discovery_seconds", "train_seconds", "run_key", "data_dir", "out", "state_dir")
"""Fields that differ from run to run by design (clocks, the random run key, tmp paths)."""
MODEL_FIELDS = ("model_sha256", "final_accuracy", "initial", "test_accuracy", "test_loss", "train_metrics",
                "final_clip")
"""Fields that hold the model's floats: compared only on the platform the pins were taken on."""


def platform_key() -> str:
    """What the model's floats depend on besides the code: torch, its CPU kernels, the machine."""
    import torch

    return f"torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()} {platform.machine()}"


def run_mode(mode: str, root: Path, data_dir: Path) -> dict[str, Any]:
    """One run of ``mode`` in ``root``: its normalised results, server ledger and node ledgers."""
    import torch
    from flwr.supercore.task_identity import TaskIdentity

    from server.run import run_server
    from tests.flower.inprocess import InProcessGrid, consortium, node_config

    saved_identity = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    saved_threads = torch.get_num_threads()
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    torch.set_num_threads(1)
    try:
        config = {**COMMON, **MODES[mode], "data-dir": str(data_dir), "state-dir": str(root / "server"),
                  "out": str(root / "out")}
        members = consortium(root / "consortium", NODES)  # distributed modes: the nodes' peers certified
        nodes = {10 + i: node_config(i, NODES, root, **POLICY, **members[i], **{"data-dir": str(data_dir),
                                                                             "seed": 11 + i})
                 for i in range(NODES)}
        history = run_server(InProcessGrid(config, nodes), config)
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved_identity
        torch.set_num_threads(saved_threads)
    results = json.loads((root / "out" / "results.json").read_text())
    return {"results": _normalised(results, history.run_key),
            "server_ledger": _ledger(root / "server" / "ledger.json", history.run_key),
            "node_ledgers": {str(i): _ledger(root / f"node{i}" / "ledger.json", history.run_key)
                             for i in range(NODES)}}


def _ledger(path: Path, run_key: str) -> Any:
    """A ledger file's JSON without its random identity, the run key as ``<run>``."""
    data = json.loads(path.read_text())
    data.pop("ledger_id", None)
    return json.loads(json.dumps(data).replace(run_key, "<run>"))


def _normalised(value: Any, run_key: str) -> Any:
    """``value`` without the ``VOLATILE`` fields, the run key as ``<run>``."""
    if isinstance(value, dict):
        return {k: _normalised(v, run_key) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_normalised(v, run_key) for v in value]
    return value.replace(run_key, "<run>") if isinstance(value, str) else value


def _without_model(value: Any) -> Any:
    """``value`` without the ``MODEL_FIELDS``."""
    if isinstance(value, dict):
        return {k: _without_model(v) for k, v in value.items() if k not in MODEL_FIELDS}
    if isinstance(value, list):
        return [_without_model(v) for v in value]
    return value


@pytest.fixture(scope="module")
def pins() -> dict[str, Any]:
    return json.loads(PINS.read_text())


@pytest.fixture(scope="module", params=sorted(MODES))
def run(request, tmp_path_factory, shared_data_dir) -> tuple[str, dict[str, Any]]:
    """(mode, its run): one run per mode, shared by the tests below."""
    return request.param, run_mode(request.param, tmp_path_factory.mktemp(request.param), shared_data_dir)


def _same_platform(pins: dict[str, Any]) -> bool:
    return pins["platform"] == platform_key()


def test_results_json_is_pinned(run, pins):
    mode, got = run
    expected = pins["modes"][mode]["results"]
    if _same_platform(pins):
        assert got["results"] == expected
    else:
        assert _without_model(got["results"]) == _without_model(expected)


def test_ledgers_are_pinned(run, pins):
    mode, got = run
    assert got["server_ledger"] == pins["modes"][mode]["server_ledger"]
    assert got["node_ledgers"] == pins["modes"][mode]["node_ledgers"]


def test_model_sha256_is_pinned(run, pins):
    mode, got = run
    if not _same_platform(pins):
        pytest.skip(f"pinned on {pins['platform']}; this is {platform_key()}")
    assert got["results"]["model_sha256"] == pins["modes"][mode]["results"]["model_sha256"]


def test_the_modes_differ():
    """The pins are four runs, not one: each mode moved the model its own way."""
    modes = json.loads(PINS.read_text())["modes"]
    assert len({m["results"]["model_sha256"] for m in modes.values()}) == len(MODES)
    assert {m["results"]["settings"]["privacy"] for m in modes.values()} == {"local", "distributed", "user"}


def record(data_dir: Path = DATA_DIR) -> None:
    """Re-record ``mode_pins.json`` from this code (a deliberate change of behaviour only)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        modes = {mode: run_mode(mode, Path(folder) / mode, data_dir) for mode in sorted(MODES)}
    PINS.write_text(json.dumps({"platform": platform_key(), "modes": modes}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINS}", file=sys.stderr)


if __name__ == "__main__":
    record()
