"""``python -m simulations.deployment`` exits non-zero when its run trained nothing (issue 38:
it printed the server's "Nothing to train" and exited 0). The command's own path from the
flags to its exit, in process, with the orchestrator's processes replaced by a stand-in
whose ``flwr run`` ends as the ServerApp ends such a run: exit 0, a results.json with no
round and the reason it stopped."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from dp_accounting import GaussianDpEvent
from dp_accounting.rdp import RdpAccountant

import simulations._orchestrator as orchestrator
from fedpriv.privacy.accountants.rdp import ORDERS
from simulations import deployment

STOPPED = "round 1: no client can afford another round"


class _Deployment:
    """``simulations._orchestrator.Deployment`` without processes: its ``flwr run`` exits 0
    once it has written ``results`` as the server's results.json."""

    results: dict = {}

    def __init__(self, out: Path, nodes: int, network: object) -> None:
        self.out = out
        self.processes = SimpleNamespace(wait=self._run)

    def _run(self, started: object) -> int:
        (self.out / "results.json").write_text(json.dumps(self.results))
        return 0

    def prepare(self, *args: object, **kwargs: object) -> None: ...
    def start_superlink(self) -> None: ...
    def start_node(self, i: int) -> None: ...
    def wait_online(self, count: int) -> None: ...
    def close(self) -> None: ...

    def start_run(self, *args: object, **kwargs: object) -> object:
        return SimpleNamespace(tail=lambda: "")

    def node_epsilons(self, delta: float) -> dict:
        return {"0": {"epsilon": 0.0, "entries": []}}


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(orchestrator, "Deployment", _Deployment)
    monkeypatch.setattr(orchestrator, "freeze_app", lambda folder: "0" * 64)
    return _Deployment


def _main(tmp_path: Path, data_dir: Path) -> dict:
    return deployment.main(["--nodes", "1", "--rounds", "1", "--limit-train", "100", "--data-dir", str(data_dir),
                            "--out", str(tmp_path / "d")])


def test_a_run_that_trained_nothing_exits_non_zero_in_one_line(stand_in, tmp_path, shared_data_dir, capsys):
    stand_in.results = {"rounds": [], "stopped": STOPPED, "final_accuracy": 0.1, "final_epsilon": {}}
    with pytest.raises(SystemExit) as exit_:
        _main(tmp_path, shared_data_dir)
    message = str(exit_.value.code)
    assert message == (f"python -m simulations.deployment: nothing was trained ({STOPPED}); the run's log says why: "
                       f"{tmp_path / 'd' / 'run.log'}")
    assert "test accuracy: none, no round was trained" in capsys.readouterr().out  # the summary came first


def test_a_run_that_trained_exits_normally(stand_in, tmp_path, shared_data_dir):
    stand_in.results = {"rounds": [{"round": 1}], "stopped": None, "final_accuracy": 0.5, "final_epsilon": {}}
    assert _main(tmp_path, shared_data_dir)["results"]["rounds"] == [{"round": 1}]


def test_a_budget_below_a_nodes_description_is_refused_before_anything_starts(stand_in, monkeypatch, tmp_path,
                                                                             shared_data_dir, capsys):
    # the repro: every node refused its DP count of examples (ε 0.178 > 0.001), "Nothing to train", exit 0
    monkeypatch.setattr(orchestrator, "Deployment", None)  # anything started would fail otherwise
    with pytest.raises(SystemExit) as exit_:
        deployment.main(["--nodes", "2", "--rounds", "1", "--noise-multiplier", "1", "--node-epsilon-budget", "0.001",
                         "--data-dir", str(shared_data_dir), "--out", str(tmp_path / "d")])
    errors = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(errors) == 1 and not (tmp_path / "d").exists()
    assert errors[0].startswith("python -m simulations.deployment: error: argument --node-epsilon-budget: 0.001 is "
                                "below what a node spends to describe itself before round 1")
    # dp-accounting's RDP ε of the node's default count noise, on the node accountant's grid of orders
    reference = RdpAccountant(orders=list(ORDERS)).compose(GaussianDpEvent(20.0)).get_epsilon(1e-5)
    assert f"ε = {reference:.4g} at δ = 1e-05" in errors[0]
