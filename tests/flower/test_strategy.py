"""The round loop (``PrivateFedAvg``) in local mode with a mocked grid and hand-made replies,
played as a malicious client: every reply is untrusted input (Prepare / Execute / Assert)."""

import dataclasses
import itertools
from unittest.mock import Mock

import numpy as np
import pytest
from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict

from fedpriv.federation import protocol
from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import Budget, dpsgd_event, epsilon_of
from fedpriv.privacy.charge import Charge
from fedpriv.training import TrainingPlan
from server.assign import Assigner, Assignment
from server.booking import BudgetExhausted
from server.discovery import ClientInfo
from server.history import History, epsilon_summary
from server.ledger import ServerLedger
from server.local import LocalDpSgd
from server.strategy import PrivateFedAvg
from tests.flower.metadata import set_metadata

pytestmark = pytest.mark.usefixtures("task_identity")

# q = 1 (a lot of 50 of 50 examples) and 3 steps a round: cheap for the RDP accountant
PLAN = TrainingPlan(model="cnn", lot_size=50, max_grad_norm=1.0, noise_multiplier=2.0, lr=0.1, local_epochs=3)
EVENTS = PLAN.round_events(50)
# a budget between the ε of one and of two rounds: one round fits, two do not
BUDGET = (epsilon_of(EVENTS[0], 1e-5) + epsilon_of(dpsgd_event(2.0, 1.0, 6), 1e-5)) / 2
ARRAYS = ArrayRecord([np.zeros(3, dtype=np.float32)])
RUN = "run-test"


def _assignment(cid: str, weight: float = 50.0) -> Assignment:
    """Each client its own C (which costs nothing: its events are every client's)."""
    return Assignment(cid, 50, dataclasses.replace(PLAN, max_grad_norm=1.0 + int(cid)), weight)


def _strategy(tmp_path, budget=10.0, clients=("0", "1", "2"), weights=None, durable=True):
    ledger = ServerLedger(Budget(epsilon=budget, delta=1e-5), tmp_path / "state" / "ledger.json" if durable else None)
    nodes = {100 + int(c): _assignment(c, (weights or {}).get(c, 50.0)) for c in clients}
    return PrivateFedAvg(ledger, nodes, History(settings={}), RUN, LocalDpSgd()), ledger


MESSAGE_IDS = itertools.count()


def _grid(nodes, respond=lambda sent: []):
    """A grid of the online ``nodes`` that gives each message an id, as a Grid's push does,
    and answers with ``respond(node → message sent)``."""
    grid = Mock()
    grid.get_node_ids.return_value = list(nodes)

    def send_and_receive(messages, timeout=None):
        messages = list(messages)
        for m in messages:
            set_metadata(m, message_id=f"m{next(MESSAGE_IDS)}")
        return respond({m.metadata.dst_node_id: m for m in messages})

    grid.send_and_receive.side_effect = send_and_receive
    return grid


def _round(strategy, respond=lambda sent: [], server_round=1, online=None):
    """One round answered by ``respond``: the new model's one array (None: the model stayed)."""
    arrays = strategy.run_round(_grid(strategy.nodes if online is None else online, respond), server_round,
                                ARRAYS, None)
    return None if arrays is ARRAYS else next(iter(arrays.values())).numpy()


def _reply(msg, value, events=EVENTS, entry=None, extra=None):
    content = RecordDict({
        protocol.ARRAYS: ArrayRecord([np.full(3, value, dtype=np.float32)]),
        protocol.PRIVACY: protocol.charge_record(Charge(entry or protocol.train_entry(RUN, 1), events)),
        **(extra or {}),
    })
    reply = Message(content, reply_to=msg)
    set_metadata(reply, src_node_id=msg.metadata.dst_node_id)
    return reply


def test_client_over_budget_is_not_sampled_and_the_round_is_booked_on_send(tmp_path):
    # Prepare: client "1" has already spent most of its budget
    strategy, ledger = _strategy(tmp_path, budget=BUDGET)
    with ledger.transaction() as book:
        book.record("1", "earlier", EVENTS)
    # Execute: no reply ever comes back; what is on disk is read as the messages leave
    seen = {}

    def respond(sent):
        seen["sent"] = sent
        seen["on disk"] = ServerLedger(Budget(BUDGET, 1e-5), tmp_path / "state" / "ledger.json").snapshot()
        return []

    assert _round(strategy, respond, 2) is None
    # Assert: only clients 0 and 2, each with its plan, the round and the run key; both
    # are charged in the durable ledger before any reply (a lost reply still counts)
    messages, on_disk = seen["sent"], seen["on disk"]
    assert sorted(messages) == [100, 102]
    config = messages[102].content.config_records[protocol.CONFIG]
    assert config["max-grad-norm"] == 3.0 and config[protocol.SERVER_ROUND] == 2 and config[protocol.RUN_KEY] == RUN
    assert on_disk.entries("0") == {protocol.train_entry(RUN, 2): EVENTS}
    assert on_disk.spent("0") == pytest.approx(epsilon_of(EVENTS[0], 1e-5))
    assert set(strategy.history.rounds[-1].failed) == {"0", "2"}


def test_no_affordable_client_stops_the_run(tmp_path):
    strategy, ledger = _strategy(tmp_path, budget=BUDGET, clients=("0",))
    with ledger.transaction() as book:
        book.record("0", "earlier", EVENTS)
    with pytest.raises(BudgetExhausted, match="no client can afford"):
        _round(strategy, server_round=2)


def test_a_resent_round_is_not_booked_twice(tmp_path):
    strategy, ledger = _strategy(tmp_path, budget=BUDGET)
    _round(strategy, server_round=1)
    _round(strategy, server_round=1)  # a resumed run re-sends round 1 under the same entry
    assert ledger.snapshot().entries("0") == {protocol.train_entry(RUN, 1): EVENTS}


@pytest.mark.parametrize("bad, reason", [
    (np.nan, "non-finite"),
    (np.inf, "non-finite"),
    (1e12, "exceeds the plan's bound"),
])
def test_non_finite_and_huge_updates_are_rejected(tmp_path, bad, reason):
    strategy, _ = _strategy(tmp_path)
    result = _round(strategy, lambda sent: [_reply(sent[100], 2.0), _reply(sent[101], bad), _reply(sent[102], 2.0)])
    np.testing.assert_array_equal(result, np.full(3, 2.0, np.float32))
    assert reason in strategy.history.rounds[-1].rejected["1"]


def test_reported_weights_are_ignored_and_the_servers_own_are_used(tmp_path):
    # A malicious client reports num-examples = 1e9 (declared 50) in an extra record
    strategy, _ = _strategy(tmp_path, clients=("0", "1"), weights={"0": 30.0, "1": 10.0})

    def forged(sent):
        return [_reply(sent[100], 1.0),
                _reply(sent[101], 4.0, extra={"metrics": MetricRecord({protocol.NUM_EXAMPLES: 1e9})})]

    assert _round(strategy, forged) == pytest.approx([1.0] * 3)
    assert "expected exactly the records" in strategy.history.rounds[-1].rejected["1"]
    # honest replies weigh by the server's own weights, 30 against 10
    strategy, _ = _strategy(tmp_path / "2", clients=("0", "1"), weights={"0": 30.0, "1": 10.0})
    result = _round(strategy, lambda sent: [_reply(sent[100], 1.0), _reply(sent[101], 4.0)])
    np.testing.assert_allclose(result, np.full(3, (30 * 1.0 + 10 * 4.0) / 40))


def test_duplicate_and_stale_replies_are_not_aggregated(tmp_path):
    strategy, _ = _strategy(tmp_path, clients=("0", "1"))
    round1 = {}

    def first(sent):
        round1.update(sent)
        return [_reply(sent[100], 1.0), _reply(sent[101], 1.0)]

    def second(sent):
        honest = _reply(sent[100], 2.0, entry=protocol.train_entry(RUN, 2))
        stale = _reply(round1[101], 100.0)  # client 1's round-1 reply, delivered again in round 2
        return [honest, honest, stale]  # and client 0's reply twice

    _round(strategy, first, 1)
    result = _round(strategy, second, 2)
    np.testing.assert_array_equal(result, np.full(3, 2.0, np.float32))
    assert strategy.history.rounds[-1].rejected == {"0": "duplicate reply"}


def test_refusals_and_mismatched_events_are_not_aggregated(tmp_path):
    strategy, ledger = _strategy(tmp_path)

    def respond(sent):
        refusal = Message(Error(code=protocol.REFUSAL_CODE, reason="over my budget"), reply_to=sent[101])
        set_metadata(refusal, src_node_id=101)
        return [_reply(sent[100], 2.0), refusal,
                _reply(sent[102], 9.0, events=(dpsgd_event(5.0, 1.0, 3),))]  # under-reports its cost

    result = _round(strategy, respond)
    np.testing.assert_array_equal(result, np.full(3, 2.0, np.float32))
    log = strategy.history.rounds[-1]
    assert set(log.failed) == {"1"} and set(log.rejected) == {"2"}
    # booked on send: all three, the refusing client included
    assert ledger.snapshot().spent("0") == ledger.snapshot().spent("1") == ledger.snapshot().spent("2") > 0


def test_no_accepted_update_keeps_the_model(tmp_path):
    strategy, _ = _strategy(tmp_path, clients=("0",))
    assert _round(strategy, lambda sent: [_reply(sent[100], np.nan)]) is None


def test_a_claimed_huge_n_moves_the_shared_rate_by_a_bounded_factor():
    honest = {1: ClientInfo("0", 5000), 2: ClientInfo("1", 5000), 3: ClientInfo("2", 6000)}
    liar = {**honest, 4: ClientInfo("3", 10**9)}  # its N was 50
    settings = RunSettings(rounds=1, noise_multiplier=1.0)
    q_honest = Assigner(settings, honest).plan.shared_sample_rate
    assigner = Assigner(settings, liar)
    # the liar counts at most 4 × the lower median (5000): ΣN grows from 16000 to 36000
    assert assigner.plan.shared_sample_rate == pytest.approx(q_honest * 16000 / 36000)
    assignments = assigner(liar)
    assert assignments[4].weight == 20000.0
    assert assignments[1].plan.steps_per_round(5000) == round(36000 / 4096)  # not 10**9 / 4096


def test_epsilon_summary_reports_count_and_spread():
    assert epsilon_summary([3.0, 0.5, float("inf"), 1.0]) == "4 clients, min 0.5000, median 2.0000, max inf"
    assert epsilon_summary([]) == "no client has spent privacy"


def test_nodes_that_connect_later_join_and_a_reconnecting_client_keeps_its_ledger(tmp_path):
    # Prepare: clients 0-2 on nodes 100-102. Before round 2, node 100 is gone and four
    # new nodes are online: 103 (a new client "3"), 104 (client "0" again, reconnected),
    # 105 (claims "1", whose node 101 is still online) and 106 (does not describe itself).
    admitted = []

    def admit(grid, node_ids):
        admitted.append(node_ids)
        claims = {103: "3", 104: "0", 105: "1"}
        return {n: _assignment(claims[n]) for n in node_ids if n in claims}

    ledger = ServerLedger(Budget(epsilon=BUDGET, delta=1e-5))
    nodes = {100 + int(c): _assignment(c) for c in ("0", "1", "2")}
    strategy = PrivateFedAvg(ledger, nodes, History(settings={}), RUN, LocalDpSgd(), admit=admit)
    with ledger.transaction() as book:
        book.record("0", "earlier", EVENTS)  # client 0 cannot afford a second round
    # Execute
    sent = {}
    online = [101, 102, 103, 104, 105, 106]
    _round(strategy, lambda messages: sent.update(messages) or [], 2, online)
    with pytest.raises(BudgetExhausted):  # round 2 spent every budget
        _round(strategy, server_round=3, online=online)
    # Assert: 103 joined; 104 replaced 100 as client "0" and, being over budget, is not
    # sampled; 105 was ignored; each new node was asked once
    assert sorted(sent) == [101, 102, 103]
    assert {n: a.client_id for n, a in strategy.nodes.items()} == {101: "1", 102: "2", 103: "3", 104: "0"}
    assert sorted(strategy.history.clients) == ["0", "1", "2", "3"]
    assert admitted == [[103, 104, 105, 106]]
    assert ledger.snapshot().entries("3") == {protocol.train_entry(RUN, 2): EVENTS}


def test_a_round_of_many_clients_logs_their_epsilon_as_one_line(tmp_path):
    """Up to ``MANY_CLIENTS`` a line per client; past it one line (min, median, max), so that a
    round of 100 sampled clients does not print 100 lines."""
    import logging

    from server.history import MANY_CLIENTS

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("flwr").addHandler(handler)
    try:
        for count in (MANY_CLIENTS, MANY_CLIENTS + 2):
            records.clear()
            strategy, _ = _strategy(tmp_path / str(count), clients=[str(c) for c in range(count)])
            assert _round(strategy, lambda sent: [_reply(m, 1.0) for m in sent.values()]) is not None
            per_client = [r for r in records if r.startswith("\tclient ")]
            summarised = [r for r in records if r.startswith("\tε of the round's clients")]
            if count == MANY_CLIENTS:
                assert len(per_client) == count and not summarised
            else:
                assert not per_client and len(summarised) == 1 and f"{count} clients, min " in summarised[0]
    finally:
        logging.getLogger("flwr").removeHandler(handler)
