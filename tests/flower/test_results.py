"""``results.json`` of a run through ``server.run.run_server`` and the real ClientApp (in
process): what the settings resolved to, the final accuracy and ε, clients in numeric order;
and ``server.run.resolved`` for the quick start's plan (default model, calibrated σ)."""

import json
import logging
import re

import pytest

from clients.task import local_data
from fedpriv.dpsgd import steps_per_epoch
from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import Budget, PrivacyLedger, dpsgd_event, epsilon_of
from fedpriv.privacy.events import ComposedEvent
from server.assign import Assigner
from server.discovery import ClientInfo
from server.history import History, RoundLog
from server.ledger import ServerLedger
from server.run import resolved, run_server
from tests.conftest import SHARED_DATA
from tests.flower.inprocess import InProcessGrid, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

SIGMA, LOT, PER_NODE, PARTITIONS = 1.0, 10, 20, 11
NODES = {20: 10, 21: 2, 22: 9}  # node id -> partition id: discovered as "10", "2", "9"


def _run(tmp_path, data_dir):
    run_config = {"rounds": 2, "min-clients": len(NODES), "limit-train": PARTITIONS * PER_NODE, "limit-test": 40,
                  "lot-size": LOT, "noise-multiplier": SIGMA, "model": "cnn", "data-dir": str(data_dir),
                  "state-dir": str(tmp_path / "server"), "out": str(tmp_path / "out")}
    nodes = {node: node_config(partition, PARTITIONS, tmp_path, **{"epsilon-budget": 50.0, "public-num-examples": True,
                                                                     "data-dir": str(data_dir)})
             for node, partition in NODES.items()}
    history = run_server(InProcessGrid(run_config, nodes), run_config)
    return history, json.loads((tmp_path / "out" / "results.json").read_text())


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory, shared_data_dir):
    """(state folder, history, results.json, Flower's log lines) of a two-round run of the CNN."""
    from simulations._flower_private import task_identity

    lines = _Lines()
    logging.getLogger("flwr").addHandler(lines)
    try:
        with task_identity(run_id=1, task_id=1, node_id=0):
            tmp_path = tmp_path_factory.mktemp("cnn")
            return (tmp_path, *_run(tmp_path, shared_data_dir), lines.lines)
    finally:
        logging.getLogger("flwr").removeHandler(lines)


def test_results_carry_what_the_settings_resolved_to(cnn_run):
    _, _, results, _ = cnn_run
    out = results["resolved"]
    assert out["model"] == "cnn" and out["accountant"] == "rdp" and out["delta"] == 1e-5
    assert out["lot_size"] == LOT and out["epsilon_budget"] == "inf"
    assert list(out["clients"]) == ["2", "9", "10"]
    settings = RunSettings.from_run_config({"limit-train": PARTITIONS * PER_NODE})
    for cid, client in out["clients"].items():  # each node's N: its share under the default partition-key
        n = len(local_data(settings, {"partition-id": int(cid), "num-partitions": PARTITIONS}, SHARED_DATA,
                           partition_key=0).labels)
        assert client == {"noise_multiplier": SIGMA, "sample_rate": LOT / n,
                          "expected_lot_size": pytest.approx(LOT), "steps_per_round": steps_per_epoch(LOT / n)}
    # and the settings stay as given (a resumed run compares them with the checkpoint's)
    assert results["settings"]["model"] == "cnn" and results["settings"]["epsilon_budget"] is None


def test_results_lead_with_final_accuracy_and_epsilon_in_numeric_client_order(cnn_run):
    tmp_path, history, results, _ = cnn_run
    assert list(results)[:6] == ["settings", "resolved", "run_key", "final_accuracy", "final_epsilon", "stopped"]
    assert results["final_accuracy"] == results["rounds"][-1]["test_accuracy"] == history.final_accuracy()
    order = ["2", "9", "10"]
    assert list(results["final_epsilon"]) == list(results["clients"]) == list(results["spent"]) == order
    for log in results["rounds"]:
        assert log["participants"] == list(log["epsilon"]) == order
    ledger = PrivacyLedger.load(tmp_path / "server" / "ledger.json")
    for client in order:
        assert results["final_epsilon"][client] == pytest.approx(ledger.spent_at(client, 1e-5), rel=1e-12)
    # every key the docs and other tests read is still there
    assert {"rounds", "clients", "final_epsilon", "stopped", "wall_time_s", "model_sha256", "run_key",
            "settings", "spent", "initial"} <= results.keys()


def test_each_round_logs_one_plain_line(cnn_run):
    *_, lines = cnn_run
    rounds = [line for line in lines if line.startswith("round ")]
    assert rounds[0].startswith("round 0/2: test accuracy ") and rounds[0].endswith("% (initial model)")
    assert [re.fullmatch(r"round (\d)/2: test accuracy \d+\.\d\d %, max client ε \d\.\d{4}, \d+\.\d s", line)
            is not None for line in rounds[1:]] == [True, True]


def test_the_default_model_and_calibrated_sigma_are_resolved_while_the_settings_stay_unset():
    # the quick start's plan: no model given, lot 256 of 4,000 examples, target ε 2 in 5 rounds
    settings = RunSettings(dataset="mnist", rounds=5, target_epsilon=2.0, lot_size=256)
    clients = {10 + i: ClientInfo(str(i), 4000) for i in range(3)}
    assigner = Assigner(settings, clients)
    ledger = ServerLedger(Budget(settings.server_budget, settings.delta))
    out = resolved(ledger, assigner, assigner(clients).values())
    assert settings.model is None and out["model"] == "scatter_linear"
    assert out["accountant"] == "rdp" and out["delta"] == 1e-5 and out["epsilon_budget"] == 2.0
    (plan,) = {tuple(c.items()) for c in out["clients"].values()}  # one calibration for all three
    plan = dict(plan)
    assert plan["sample_rate"] == 256 / 4000 and plan["steps_per_round"] == steps_per_epoch(256 / 4000)
    assert plan["noise_multiplier"] > 0
    events = (dpsgd_event(plan["noise_multiplier"], plan["sample_rate"], plan["steps_per_round"]),) * 5
    assert epsilon_of(ComposedEvent(events), 1e-5) <= 2.0


def test_final_accuracy_is_none_when_no_round_ran():
    history = History(settings={}, initial={"test_accuracy": 0.1, "test_loss": 2.3})
    assert history.to_json()["final_accuracy"] is None  # the initial model's accuracy is no result
    assert history.to_json()["initial"]["test_accuracy"] == 0.1
    history.rounds.append(RoundLog(1, ["0"], test_accuracy=0.8))
    data = history.to_json()
    assert data["final_accuracy"] == 0.8
    assert History.from_json(data).to_json() == data  # a checkpoint's history round-trips
