"""The classic algorithms across Flower ClientApps (in-process grid): each node books its
release in its own durable ledger before touching its data, refuses past its budget and
never answers one entry twice; the server drops a share that does not match the request."""

import numpy as np
import pytest

from clients.classic.client_app import app
from fedpriv.algorithms import kmeans, linreg
from fedpriv.algorithms.datasets import load
from fedpriv.privacy import PrivacyLedger, make_accountant
from server.classic.loops import federated_dplloyd, federated_linreg
from tests.flower.inprocess import InProcessGrid, booked, node_config

pytestmark = pytest.mark.usefixtures("task_identity")
DIABETES = linreg.Bounds(np.full(10, -0.2), np.full(10, 0.2), (25.0, 346.0))
IRIS = kmeans.Box(np.zeros(4), np.full(4, 8.0))


def _grid(tmp_path, clients: int, budget: float) -> InProcessGrid:
    nodes = {i: node_config(i, clients, tmp_path, **{"epsilon-budget": budget, "randomness": "seeded", "seed": 1})
             for i in range(clients)}
    return InProcessGrid({}, nodes, client_app=app)


def _spent(tmp_path, client: int) -> tuple[int, float]:
    ledger = PrivacyLedger.load(tmp_path / f"node{client}" / "ledger.json")
    accountant = make_accountant("basic")
    for events in ledger.entries(str(client)).values():
        for event in events:
            accountant.compose(event)
    return len(ledger.entries(str(client))), accountant.epsilon(1e-5)


def test_federated_linreg_books_epsilon_per_node_and_fits(tmp_path):
    grid = _grid(tmp_path, 3, budget=2e4)
    weights, shares = federated_linreg(grid, "diabetes", 0, 1e4, DIABETES)
    assert sorted(shares.events) == [str(n) for n in grid.get_node_ids()] and not shares.refused
    for client in range(3):
        entries, epsilon = _spent(tmp_path, client)
        assert entries == 1 and epsilon == pytest.approx(1e4, rel=1e-6)
    x_train, y_train, x_test, y_test = load("diabetes", 0)
    central, _ = linreg.fit(x_train, y_train, DIABETES, 1e5, rng=np.random.default_rng(0))  # 1e6: output_step refuses
    federated = np.mean((linreg.predict(weights, x_test, DIABETES) - y_test) ** 2)
    assert federated < 1.1 * np.mean((linreg.predict(central, x_test, DIABETES) - y_test) ** 2)


def test_a_node_refuses_a_release_over_its_budget_before_reading_data(tmp_path, monkeypatch):
    read = []
    monkeypatch.setattr("clients.classic.algorithms.load", lambda *args: read.append(args))
    grid = _grid(tmp_path, 2, budget=1.0)
    _, shares = federated_linreg(grid, "diabetes", 0, 2.0, DIABETES)
    assert len(shares.refused) == 2 and all("exceed its budget" in r for r in shares.refused.values())
    assert read == [] and not booked(tmp_path / "node0")  # nothing booked, nothing read


def test_federated_dplloyd_spends_epsilon_over_its_iterations_and_clusters(tmp_path):
    grid = _grid(tmp_path, 3, budget=2e4)
    centroids, shares = federated_dplloyd(grid, "iris", 0, 1e4, 3, IRIS, iterations=4)
    assert not shares.refused
    for client in range(3):
        entries, epsilon = _spent(tmp_path, client)
        assert entries == 5 and epsilon == pytest.approx(1e4, rel=1e-6)  # the moments, then 4 iterations
    x_train, y_train, _, _ = load("iris", 0)
    assert kmeans.clustering_accuracy(y_train.astype(int), kmeans.assign(x_train, centroids)) > 0.8


def test_a_replayed_release_is_refused_and_a_bad_share_dropped(tmp_path, monkeypatch):
    grid = _grid(tmp_path, 2, budget=10.0)
    monkeypatch.setattr("server.classic.loops.secrets.token_hex", lambda n: "a" * (2 * n))  # the server repeats its key
    federated_linreg(grid, "diabetes", 0, 1.0, DIABETES)
    _, shares = federated_linreg(grid, "diabetes", 0, 1.0, DIABETES)
    assert all("already ran" in reason for reason in shares.refused.values()) and len(shares.refused) == 2
    assert _spent(tmp_path, 0)[0] == 1
    # a node whose reply claims other events (here: a cheaper release) is not summed
    real = grid.client_app

    def cheat(message, context):
        reply = real(message, context)
        if context.node_config["partition-id"] == 1 and not reply.has_error():
            from fedpriv.federation import protocol
            from fedpriv.privacy.charge import Charge
            from fedpriv.privacy.events import LaplaceEvent
            booked = protocol.read_charge(reply.content.config_records[protocol.PRIVACY])
            reply.content.config_records[protocol.PRIVACY] = protocol.charge_record(
                Charge(booked.entry, (LaplaceEvent(100.0),)))
        return reply

    grid.client_app = cheat
    monkeypatch.setattr("server.classic.loops.secrets.token_hex", lambda n: "b" * (2 * n))
    _, shares = federated_linreg(grid, "diabetes", 0, 1.0, DIABETES)
    assert list(shares.refused) == ["1"] and list(shares.events) == ["0"]


def test_federated_ann_books_each_round_and_composes_to_epsilon_under_dp_accounting(tmp_path):
    import dp_accounting

    from fedpriv.algorithms import iris
    from fedpriv.privacy.events import to_dp_accounting
    from server.classic.loops import AnnPlan, federated_ann

    grid = _grid(tmp_path, 3, budget=10.0)
    model, shares = federated_ann(grid, "iris", 0, 10.0, 1e-5, share_size=40)
    rounds = AnnPlan().rounds
    assert not shares.refused and all(len(events) == rounds for events in shares.events.values())
    for client in range(3):
        booked = PrivacyLedger.load(tmp_path / f"node{client}" / "ledger.json").entries(str(client))
        assert len(booked) == rounds
        reference = dp_accounting.rdp.RdpAccountant()  # dp-accounting's own orders, not fedpriv's
        for events in booked.values():
            for event in events:
                reference.compose(to_dp_accounting(event))
        assert 9.5 < reference.get_epsilon(1e-5) <= 10.0 * 1.01
    _, _, x_test, y_test = load("iris", 0)
    # seeded nodes: deterministic; 0.933 at AnnPlan's q = 1, 0.833 at the q = 0.5 it had (docs/classic.md)
    assert iris.accuracy(model, x_test, y_test.astype(int)) >= 0.9
    # the budget is spent: a further round is refused by every node, and nothing is booked
    _, again = federated_ann(grid, "iris", 0, 10.0, 1e-5, share_size=40, plan=AnnPlan(rounds=1))
    assert len(again.refused) == 3 and all("exceed its budget" in r for r in again.refused.values())


def test_federated_output_perturbation_books_every_answer_and_refuses_past_the_budget(tmp_path):
    from server.classic.loops import federated_answers

    grid = _grid(tmp_path, 2, budget=300.0)
    _, _, x_test, y_test = load("iris", 0)
    answers, shares = federated_answers(grid, "iris", 0, 10.0, x_test)
    assert answers.shape == (30, 3) and not shares.refused
    assert (answers.argmax(axis=1) == y_test.astype(int)).mean() > 0.8
    for client in range(2):
        assert _spent(tmp_path, client) == (1, pytest.approx(30 * 10.0, rel=1e-6))  # ε per answer, 30 answers
    _, shares = federated_answers(grid, "iris", 0, 10.0, x_test[:1])
    assert len(shares.refused) == 2  # one more answer would pass 300


def test_a_noiseless_or_malformed_training_or_query_request_is_refused_and_books_nothing(tmp_path):
    """The curious server asks for DP-SGD without noise (σ = 0: infinite ε), sends weights
    of another model, or queries of the wrong width: every node refuses before booking."""
    from fedpriv.algorithms import iris
    from fedpriv.privacy.events import LaplaceEvent
    from server.classic.loops import Shares, _ask

    grid = _grid(tmp_path, 2, budget=100.0)
    ann = {"algorithm": "ann-iris", "dataset": "iris", "seed": 0, "run-key": "run-" + "ab" * 6, "sample-rate": 0.5,
           "steps": 10, "max-grad-norm": 1.0, "lr": 0.1, "lot-size": 20.0}
    answers = {"algorithm": "output-perturbation", "dataset": "iris", "seed": 0, "run-key": "run-" + "ab" * 6,
               "epsilon": 1.0}
    cases = [({**ann, "noise-multiplier": 0.0, "step": 0}, {"weights": np.zeros(iris.NUM_PARAMETERS)}),
             ({**ann, "noise-multiplier": 1.0, "step": 1}, {"weights": np.zeros(iris.NUM_PARAMETERS + 1)}),
             ({**answers, "step": 2}, {"queries": np.zeros((3, iris.NUM_FEATURES - 1))})]
    refusals = []
    for config, arrays in cases:
        shares = Shares()
        _, accepted = _ask(grid, config, arrays, 1, LaplaceEvent(1.0), shares)
        assert accepted == 0 and len(shares.refused) == 2
        refusals.append(list(shares.refused.values()))
    assert all("exceed its budget" in reason for reason in refusals[0])  # σ = 0 costs infinite ε
    assert not booked(tmp_path / "node0") and not booked(tmp_path / "node1")


def test_a_release_that_spends_more_than_it_booked_never_leaves_the_node(tmp_path, monkeypatch, caplog):
    """A kind whose noise is weaker than its booked cost (here: a release claiming half the
    ε it booked, as a halved noise scale would) sends no values: the node's check fails closed,
    with a fixed reason (the details stay in the node's log)."""
    from clients.classic import algorithms
    from fedpriv.federation import protocol
    from fedpriv.privacy.events import LaplaceEvent

    real = algorithms.RELEASES["linreg"]
    cheated = algorithms.Algorithm(real.parse, lambda params, node, rng: (real.compute(params, node, rng)[0],
                                                                           LaplaceEvent(0.5)))
    monkeypatch.setitem(algorithms.RELEASES, "linreg", cheated)
    grid = _grid(tmp_path, 2, budget=10.0)
    _, shares = federated_linreg(grid, "diabetes", 0, 1.0, DIABETES)
    assert not shares.events and len(grid.log) == 2
    assert all(reply.has_error() and reply.error.code == protocol.FAILURE_CODE
               and reply.error.reason == protocol.FAILED_AFTER_BOOKING for reply in grid.log)
    assert "not the charged" in caplog.text
