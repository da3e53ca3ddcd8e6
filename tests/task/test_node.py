"""A user's task through fedpriv's real ServerApp and ClientApp, in process (no Ray): each
privacy mode (local, distributed, user level with central or distributed noise) trains the
tabular template with every node's ε, by its own durable ledger, within its budget; a
broken task is refused by every node before it books anything; a node evaluates a task by
its own loss and metrics (``clients.evaluation``); a map-style data set trains lot by lot."""

import math
import sys

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from clients.client_app import app as dpsgd_app
from clients.evaluation import LOSS_CLIP_KEY
from fedpriv.federation import protocol
from fedpriv.federation.policy import load_policy
from fedpriv.model_names import TASK_MODEL
from fedpriv.new import new_app
from fedpriv.privacy import PrivacyLedger
from fedpriv.project import run_config_defaults
from fedpriv.task import load_task
from server.run import run_server
from tests.flower.inprocess import InProcessGrid, booked, node_config
from tests.flower.metadata import set_metadata
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


REGRESSION = GOOD.replace("nn.Linear(4, 2)", "nn.Linear(4, 1)").replace("(x[:, 0] > 0).long()", "x[:, :1] * 2") + """
def loss(outputs, targets):
    return torch.nn.functional.mse_loss(outputs, targets)
"""


def test_a_federation_evaluates_a_regression_task_on_its_nodes_each_booking_it(tmp_path, write_app):
    """The real ServerApp and ClientApp on a task with its own loss (a regression): each node
    answers the federated EVALUATE (it used to refuse it) and books it once; the server sums
    the noisy counts (std 1 per node here: near the 2 × 10 test records)."""
    app = write_app(REGRESSION, name="federated")
    grid, config = _federation(app, tmp_path / "state", {"fraction-evaluate": 1.0, "epsilon-budget": 100.0},
                               {"allow-evaluate": True, "evaluate-noise": 1.0, "epsilon-budget": 100.0})
    history = run_server(grid, config)
    assert not [reply.error.reason for reply in grid.log if reply.has_error()]
    evaluation = history.rounds[0].federated_evaluation
    assert abs(evaluation["count"] - 20) < 10 and not evaluation["rejected"] and math.isfinite(evaluation["loss"])
    for i in range(2):
        entries = booked(tmp_path / "state" / f"node{i}")[str(i)]
        assert sum(e.endswith("/evaluate") for e in entries) == 1 and any(e.endswith("/train") for e in entries)


def _evaluate(app, state, loss_clip=None, **policy):
    """The node's reply to one EVALUATE of ``app``'s task model (weights of seed 7), that model
    and the node's policy."""
    sys.path.insert(0, str(app))  # as Flower puts an app's folder (the write_app fixture restores it)
    model = load_task("task").build_model(7)
    config = {protocol.MODEL: TASK_MODEL, protocol.SERVER_ROUND: 1, protocol.RUN_KEY: "run-a"}
    if loss_clip is not None:
        config[LOSS_CLIP_KEY] = loss_clip
    content = RecordDict({protocol.ARRAYS: ArrayRecord(model.state_dict()), protocol.CONFIG: ConfigRecord(config)})
    message = Message(content, dst_node_id=5, message_type=MessageType.EVALUATE)
    set_metadata(message, message_id="m")
    node = node_config(0, 2, state, **{"epsilon-budget": math.inf, "data-dir": str(app / "data"), "seed": 0,
                                       "randomness": "seeded", "public-num-examples": True, "allow-evaluate": True,
                                       "evaluate-noise": 1e-3, **policy})
    context = Context(run_id=1, node_id=5, node_config=node, state=RecordDict(),
                      run_config={**run_config_defaults(), "task": "task", "data-dir": str(app / "data")})
    return dpsgd_app(message, context), model, load_policy(node)


def _test_set(partition_id=0):
    """The node's test records, as GOOD's load_data draws them (written out here, not read from it)."""
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(partition_id))[:10]
    return x, x[:, :1] * 2


def test_a_regression_task_is_evaluated_by_its_own_loss_clipped_to_the_requests_bound(tmp_path, write_app):
    """A node's noisy evaluation of a task with its own loss (here mean squared error on a
    regression) sums that loss per record, each clipped to the bound the request names, and
    books it as one evaluate event; no accuracy exists for it, so "correct" is a noised 0.
    (Noise of std 1e-3 per unit: the released sums are the exact ones.)"""
    app = write_app(REGRESSION, name="ownloss")
    reply, model, policy = _evaluate(app, tmp_path / "state", loss_clip=0.5)
    assert not reply.has_error(), reply.error.reason
    metrics = reply.content.metric_records[protocol.METRICS]
    x, y = _test_set()
    with torch.no_grad():
        squared = ((model(x) - y) ** 2).squeeze(1)
    reference = float(squared.clamp(max=0.5).sum())
    assert 0 < reference < 0.5 * len(y) and float(squared.sum()) - reference > 0.1  # some records clipped
    assert metrics[protocol.COUNT] == len(y) and metrics[protocol.CORRECT] == 0
    assert metrics[protocol.LOSS_SUM] == pytest.approx(reference, abs=5e-3)  # noise: std 1e-3 · 0.5
    assert booked(tmp_path / "state" / "node0") == {"0": {"run-a/round-1/evaluate": (policy.evaluate_event(),)}}


def test_a_tasks_metrics_count_a_record_correct_by_its_own_accuracy(tmp_path, write_app):
    """With ``metrics``, a record is correct where its accuracy alone is ≥ 1/2 (its batch's other
    metrics never leave the node); the loss is the task's (here cross-entropy with label
    smoothing), per record."""
    source = GOOD + """
def loss(outputs, targets):
    return torch.nn.functional.cross_entropy(outputs, targets, label_smoothing=0.2)

def metrics(outputs, targets):
    return {"accuracy": float((outputs.argmax(dim=1) == targets).float().mean()), "f1": 0.5}
"""
    reply, model, _ = _evaluate(write_app(source, name="metrics"), tmp_path / "state")
    assert not reply.has_error(), reply.error.reason
    metrics = reply.content.metric_records[protocol.METRICS]
    x, _ = _test_set()
    y = (x[:, 0] > 0).long()
    with torch.no_grad():
        outputs = model(x)
        log_p = outputs.log_softmax(dim=1)
        smoothed = -(0.8 * log_p.gather(1, y[:, None]).squeeze(1) + 0.1 * log_p.sum(dim=1))  # 0.2 spread over 2
    assert set(metrics.keys()) == set(protocol.EVALUATE_METRICS)
    assert metrics[protocol.CORRECT] == int((outputs.argmax(dim=1) == y).sum())
    assert metrics[protocol.LOSS_SUM] == pytest.approx(float(smoothed.sum()), abs=0.1)  # noise: std 1e-3 · 10


@pytest.mark.parametrize("loss_clip", [0.0, -1.0, float("inf"), 2.0**21, "10"])
def test_a_bad_loss_bound_is_refused_before_booking(tmp_path, write_app, loss_clip):
    reply, _, _ = _evaluate(write_app(REGRESSION, name="badclip"), tmp_path / "state", loss_clip=loss_clip)
    assert reply.has_error() and "loss-clip" in reply.error.reason
    assert booked(tmp_path / "state" / "node0") == {}


def test_a_loss_that_scores_no_record_alone_is_refused_evaluation_before_booking(tmp_path, write_app):
    """A loss that reads the whole batch's values (here its largest output, as a Python float)
    cannot be taken per record: the node refuses the EVALUATE before it books."""
    source = REGRESSION.replace("return torch.nn.functional.mse_loss(outputs, targets)",
                                "return ((outputs - targets) ** 2).mean() * float(outputs.abs().max())")
    reply, _, _ = _evaluate(write_app(source, name="batchloss"), tmp_path / "state")
    assert reply.has_error() and "cannot evaluate the task" in reply.error.reason
    assert booked(tmp_path / "state" / "node0") == {}
