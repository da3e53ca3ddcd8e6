"""A user's task through fedpriv's real ServerApp and ClientApp, in process (no Ray): each
privacy mode (local, distributed, user level with central or distributed noise) trains the
tabular template with every node's ε, by its own durable ledger, within its budget; a
broken task is refused by every node before it books anything."""

import sys

import pytest

from fedpriv.new import new_app
from fedpriv.privacy import PrivacyLedger
from server.run import run_server
from simulations._cli import run_config_defaults
from tests.flower.inprocess import InProcessGrid, booked, node_config
from tests.task.conftest import GOOD

pytestmark = pytest.mark.usefixtures("task_identity")

BUDGET = 8.0
MODES = {
    "local": ({}, {}),
    "distributed": ({"privacy": "distributed", "rounds": 2},
                    {"allow-distributed": True, "min-cohort": 2, "trust-server-cohort": True}),
    # a participant's own cost of user-level rounds (Gaussian(z/2) per round) is above the
    # population's target: its node's budget must leave room for it (docs/user-level.md)
    "user": ({"privacy": "user", "server-randomness": "seeded"}, {"allow-central-user": True, "epsilon-budget": 50.0}),
    # the cohort's noise shares over SecAgg+ (docs/user-level.md): both nodes, each share sized for 2
    "user-distributed": ({"privacy": "user", "user-noise": "distributed", "cohort": 2, "server-randomness": "seeded"},
                         {"allow-distributed": True, "min-cohort": 2, "trust-server-cohort": True,
                          "epsilon-budget": 50.0}),
}


def _federation(app, state, run_config, policy):
    sys.path.insert(0, str(app))  # as Flower puts an app's folder (the write_app fixture restores it)
    config = {**run_config_defaults(), "task": "task", "min-clients": 2, "rounds": 1, "target-epsilon": BUDGET,
              "data-dir": str(app / "data"), "round-timeout": 600.0, **run_config}
    nodes = {i: node_config(i, 2, state, **{"epsilon-budget": BUDGET, "data-dir": str(app / "data"),
                                            "randomness": "seeded", "seed": 0, "public-num-examples": True, **policy})
             for i in range(2)}
    return InProcessGrid(config, nodes), config


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_privacy_mode_trains_a_task_within_each_nodes_budget(mode, tmp_path, write_app):
    app = new_app(tmp_path / "tabular", "tabular")
    grid, config = _federation(app, tmp_path / "state", *MODES[mode])
    history = run_server(grid, config)
    assert len(history.rounds) == config["rounds"] and history.model_sha256
    for log in history.rounds:  # both nodes' updates in every round's aggregate
        assert sorted(log.participants) == ["0", "1"] and not log.failed and not log.rejected and not log.discarded
    for i in range(2):
        ledger = PrivacyLedger.load(tmp_path / "state" / f"node{i}" / "ledger.json")
        assert 0 < ledger.spent_at(str(i), 1e-5) <= MODES[mode][1].get("epsilon-budget", BUDGET)  # its own account
        assert any("/train" in entry for entry in ledger.entries(str(i)))


LAZY = GOOD.replace("def load_data(", """
class Items(torch.utils.data.Dataset):
    \"\"\"A map-style data set, no TensorDataset: it records the largest fetch.\"\"\"

    largest = 0

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])

    def __getitems__(self, indices):
        Items.largest = max(Items.largest, len(indices))
        return [self[i] for i in indices]

def load_data(""").replace("torch.randn(40, 3", "torch.randn(400, 3").replace(
    "return torch.utils.data.TensorDataset(x, y),", "return Items(x, y),")


def test_a_map_style_data_set_trains_lot_by_lot(tmp_path, write_app):
    """The node fetches each micro-batch of a lot from the task's data set, never all of it."""
    app = write_app(LAZY, name="lazy")
    grid, config = _federation(app, tmp_path / "state", {"max-physical-batch": 16, "lot-size": 64, "rounds": 1}, {})
    history = run_server(grid, config)
    assert len(history.rounds) == 1 and not history.rounds[0].failed
    assert 0 < sys.modules["task"].Items.largest <= 16


def test_a_broken_task_is_refused_by_every_node_before_booking(tmp_path, write_app):
    app = write_app(GOOD.replace("nn.Tanh()", "nn.BatchNorm1d(4)"), name="broken")
    grid, config = _federation(app, tmp_path / "state", {}, {})
    history = run_server(grid, config)
    assert not history.rounds
    refusals = [reply.error.reason for reply in grid.log if reply.has_error()]
    assert len(refusals) >= 2 and all("task.model(): DP-SGD needs per-example" in r for r in refusals)
    for i in range(2):
        assert booked(tmp_path / "state" / f"node{i}") == {}


def test_a_task_with_its_own_loss_is_refused_evaluation_before_booking(tmp_path, write_app):
    """A node's noisy evaluation counts cross-entropy and argmax: for a task with its own loss
    (here a regression) it would book budget for a score of another loss, or fail after
    booking; the node refuses the EVALUATE before it books, while TRAIN (the task's loss) runs."""
    regression = GOOD.replace("nn.Linear(4, 2)", "nn.Linear(4, 1)").replace("(x[:, 0] > 0).long()", "x[:, :1] * 2")
    source = regression + "\ndef loss(outputs, targets):\n    return torch.nn.functional.mse_loss(outputs, targets)\n"
    app = write_app(source, name="ownloss")
    grid, config = _federation(app, tmp_path / "state", {"fraction-evaluate": 1.0, "epsilon-budget": 100.0},
                               {"allow-evaluate": True, "epsilon-budget": 100.0})
    history = run_server(grid, config)
    assert len(history.rounds) == 1
    refusals = [reply.error.reason for reply in grid.log if reply.has_error()]
    assert len(refusals) == 2 and all("the task has its own loss" in r for r in refusals)
    for i in range(2):
        entries = PrivacyLedger.load(tmp_path / "state" / f"node{i}" / "ledger.json").entries(str(i))
        assert any(e.endswith("/train") for e in entries) and not any(e.endswith("/evaluate") for e in entries)
