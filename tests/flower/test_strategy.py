"""BudgetedFedAvg with a mocked grid and hand-made replies (Prepare / Execute / Assert)."""

from unittest.mock import Mock

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from clients import protocol
from fedpriv.privacy import Budget, PrivacyLedger, dpsgd_event, epsilon_of
from server.history import History, epsilon_summary
from server.strategy import Assignment, BudgetedFedAvg, BudgetExhausted

pytestmark = pytest.mark.usefixtures("task_identity")

EVENTS = (dpsgd_event(2.0, 1.0, 3),)  # q = 1: cheap for the RDP accountant
# a budget between the ε of one and of two rounds: one round fits, two do not
BUDGET = (epsilon_of(EVENTS[0], 1e-5) + epsilon_of(dpsgd_event(2.0, 1.0, 6), 1e-5)) / 2
ARRAYS = ArrayRecord([np.zeros(3, dtype=np.float32)])


def _strategy(tmp_path, budget=10.0, clients=("0", "1", "2")):
    ledger = PrivacyLedger(Budget(epsilon=budget, delta=1e-5), accountant="rdp")
    nodes = {100 + int(c): Assignment(c, 50, {"noise-multiplier": 1.0 + int(c)}, EVENTS) for c in clients}
    history = History(settings={})
    return BudgetedFedAvg(ledger, nodes, history, ledger_path=tmp_path / "ledger.json"), ledger


def _grid(nodes):
    grid = Mock()
    grid.get_node_ids.return_value = list(nodes)
    return grid


def _reply(msg, value, events=EVENTS, num_examples=50):
    content = RecordDict({
        protocol.ARRAYS: ArrayRecord([np.full(3, value, dtype=np.float32)]),
        protocol.METRICS: MetricRecord({protocol.NUM_EXAMPLES: num_examples, protocol.TRAIN_LOSS: 1.0}),
        protocol.PRIVACY: protocol.events_record("x", events),
    })
    return Message(content, reply_to=msg)


def test_client_over_budget_is_not_sampled(tmp_path):
    # Prepare: client "1" has already spent most of its budget
    strategy, ledger = _strategy(tmp_path, budget=BUDGET)
    ledger.record("1", 1, EVENTS)
    assert not ledger.can_afford("1", EVENTS) and ledger.can_afford("0", EVENTS)
    # Execute
    messages = list(strategy.configure_train(2, ARRAYS, ConfigRecord({"lr": 0.1}), _grid(strategy.nodes)))
    # Assert: only clients 0 and 2, each with its own σ, the round, and the caller's keys
    assert sorted(m.metadata.dst_node_id for m in messages) == [100, 102]
    configs = {m.metadata.dst_node_id: m.content.config_records[protocol.CONFIG] for m in messages}
    assert configs[102]["noise-multiplier"] == 3.0 and configs[102][protocol.SERVER_ROUND] == 2
    assert configs[100]["lr"] == 0.1


def test_caller_config_not_mutated(tmp_path):
    strategy, _ = _strategy(tmp_path)
    config = ConfigRecord({"lr": 0.1})
    list(strategy.configure_train(1, ARRAYS, config, _grid(strategy.nodes)))
    assert dict(config) == {"lr": 0.1}


def test_no_affordable_client_stops_the_run(tmp_path):
    strategy, ledger = _strategy(tmp_path, budget=BUDGET, clients=("0",))
    ledger.record("0", 1, EVENTS)
    with pytest.raises(BudgetExhausted, match="no client can afford"):
        strategy.configure_train(2, ARRAYS, ConfigRecord(), _grid(strategy.nodes))


def test_refusal_and_mismatch_do_not_stop_aggregation(tmp_path):
    # Prepare: three sampled clients; 0 trains honestly, 1 refuses, 2 under-reports σ
    strategy, ledger = _strategy(tmp_path)
    messages = {m.metadata.dst_node_id: m for m in
                strategy.configure_train(1, ARRAYS, ConfigRecord(), _grid(strategy.nodes))}
    replies = [
        _reply(messages[100], 2.0),
        Message(Error(code=protocol.REFUSAL_CODE, reason="over my budget"), reply_to=messages[101]),
        _reply(messages[102], 9.0, events=(dpsgd_event(5.0, 1.0, 3),)),
    ]
    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)
    # Assert: only client 0's update is aggregated; 0 and 2 are booked (their updates
    # reached the server), the refusing client is not; the ledger file is written
    np.testing.assert_array_equal(next(iter(arrays.values())).numpy(), np.full(3, 2.0, np.float32))
    log = strategy.history.rounds[-1]
    assert set(log.failed) == {"1"} and set(log.rejected) == {"2"}
    assert ledger.spent("0") == ledger.spent("2") > 0 == ledger.spent("1")
    assert PrivacyLedger.load(tmp_path / "ledger.json") == ledger
    assert log.epsilon["0"] == ledger.spent("0")


def test_weighted_by_num_examples(tmp_path):
    strategy, _ = _strategy(tmp_path, clients=("0", "1"))
    messages = sorted(strategy.configure_train(1, ARRAYS, ConfigRecord(), _grid(strategy.nodes)),
                      key=lambda m: m.metadata.dst_node_id)
    replies = [_reply(messages[0], 1.0, num_examples=30), _reply(messages[1], 4.0, num_examples=10)]
    arrays, _ = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(next(iter(arrays.values())).numpy(), np.full(3, 1.75))


def test_epsilon_summary_reports_count_and_spread():
    # Act
    line = epsilon_summary([3.0, 0.5, float("inf"), 1.0])
    # Assert
    assert line == "4 clients, min 0.5000, median 2.0000, max inf"
    assert epsilon_summary([]) == "no client has spent privacy"


def test_nodes_that_connect_later_join_and_a_reconnecting_client_keeps_its_ledger(tmp_path):
    # Prepare: clients 0-2 on nodes 100-102. Before round 2, node 100 is gone and four
    # new nodes are online: 103 (a new client "3"), 104 (client "0" again, reconnected),
    # 105 (claims "1", whose node 101 is still online) and 106 (does not describe itself).
    admitted = []

    def admit(grid, node_ids):
        admitted.append(node_ids)
        claims = {103: "3", 104: "0", 105: "1"}
        return {n: Assignment(claims[n], 50, {"noise-multiplier": 1.0}, EVENTS) for n in node_ids if n in claims}

    ledger = PrivacyLedger(Budget(epsilon=BUDGET, delta=1e-5), accountant="rdp")
    nodes = {100 + int(c): Assignment(c, 50, {"noise-multiplier": 1.0}, EVENTS) for c in ("0", "1", "2")}
    strategy = BudgetedFedAvg(ledger, nodes, History(settings={}), admit=admit)
    ledger.record("0", 1, EVENTS)  # client 0 cannot afford a second round
    # Execute
    messages = strategy.configure_train(2, ARRAYS, ConfigRecord(), _grid([101, 102, 103, 104, 105, 106]))
    strategy.configure_train(3, ARRAYS, ConfigRecord(), _grid([101, 102, 103, 104, 105, 106]))
    # Assert: 103 joined; 104 replaced 100 as client "0" and, being over budget, is not
    # sampled; 105 was ignored; each new node was asked once
    assert sorted(m.metadata.dst_node_id for m in messages) == [101, 102, 103]
    assert {n: a.client_id for n, a in strategy.nodes.items()} == {101: "1", 102: "2", 103: "3", 104: "0"}
    assert sorted(strategy.history.clients) == ["0", "1", "2", "3"]
    assert admitted == [[103, 104, 105, 106]]
