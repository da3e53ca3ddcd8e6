"""Crashes and schedules, in process through ``server.run.run_server`` and the real ClientApp:
a killed server resumes without counting anything twice, and over random schedules of
runs, lost replies, node restarts and server kills no node exceeds its budget and the
server's ledger never shows less than a node's."""

import math

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from clients.task import local_data
from fedpriv.federation import protocol
from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import PrivacyLedger, dpsgd_event, epsilon_of
from fedpriv.privacy.events import ComposedEvent
from server.run import run_server
from server.state import StateError
from tests.conftest import SHARED_DATA
from tests.flower.inprocess import InProcessGrid, ServerKilled, booked, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

SIGMA, LOT, PER_NODE = 1.0, 10, 20
ROUND = (dpsgd_event(SIGMA, LOT / PER_NODE, 2),)  # q = 0.5, round(1/q) = 2 steps
# a partition-key under which the first 2·PER_NODE records split PER_NODE / PER_NODE: both
# nodes' rounds then cost ROUND (membership is a per-record rule; sizes vary with the key)
KEY = next(k for k in range(1000) if len(local_data(
    RunSettings.from_run_config({"limit-train": 2 * PER_NODE}), {"partition-id": 0, "num-partitions": 2},
    SHARED_DATA, partition_key=k).labels) == PER_NODE)
DELTA = 1e-5


def _rounds_epsilon(k: int) -> float:
    return epsilon_of(ComposedEvent(ROUND * k), DELTA)


def _run_config(data_dir, state, out, rounds=3, resume=False):
    return {"rounds": rounds, "min-clients": 2, "limit-train": 2 * PER_NODE, "limit-test": 40,
            "lot-size": LOT, "noise-multiplier": SIGMA, "model": "cnn", "data-dir": str(data_dir),
            "state-dir": str(state / "server"), "resume": resume, "out": str(out),
            "epsilon-budget": _rounds_epsilon(10)}


def _nodes(state, budgets, data_dir):
    return {10 + i: node_config(i, 2, state, **{"epsilon-budget": b, "public-num-examples": True, "partition-key": KEY,
                                                "data-dir": str(data_dir)})
            for i, b in enumerate(budgets)}


def _ledger(path) -> PrivacyLedger:
    return PrivacyLedger.load(path)


def test_a_killed_server_resumes_and_ends_where_an_uninterrupted_run_ends(tmp_path, shared_data_dir):
    budgets = [math.inf, math.inf]
    # Prepare: the uninterrupted run
    plain = tmp_path / "plain"
    run_server(InProcessGrid(_run_config(shared_data_dir, plain, plain / "out"),
                             _nodes(plain, budgets, shared_data_dir)),
               _run_config(shared_data_dir, plain, plain / "out"))
    # Execute: the same run killed in round 2, after client 0 trained and before client 1
    # did, then resumed (the nodes restart too: new Contexts)
    killed = tmp_path / "killed"
    grid = InProcessGrid(_run_config(shared_data_dir, killed, killed / "out"), _nodes(killed, budgets, shared_data_dir))
    grid.kill_after = 2 + 2 + 1  # two QUERYs, round 1's two TRAINs, client 0's round 2
    with pytest.raises(ServerKilled):
        run_server(grid, _run_config(shared_data_dir, killed, killed / "out"))
    resumed_config = _run_config(shared_data_dir, killed, killed / "out", resume=True)
    history = run_server(InProcessGrid(resumed_config, _nodes(killed, budgets, shared_data_dir)), resumed_config)
    # Assert: rounds 1-3, round 2 re-sent under the same entry (client 0 refused a second
    # training); every ledger holds each entry once and equals the uninterrupted run's ε
    assert [r.round for r in history.rounds] == [1, 2, 3]
    assert "already ran" in history.rounds[1].failed["0"]
    server = _ledger(killed / "server" / "ledger.json")
    run_key = history.run_key
    for client in ("0", "1"):
        expected = [protocol.train_entry(run_key, r) for r in (1, 2, 3)]
        assert list(server.entries(client)) == expected
        node = _ledger(killed / f"node{client}" / "ledger.json")
        assert list(node.entries(client)) == expected
        for ledger in (server, node):
            assert ledger.spent_at(client, DELTA) == pytest.approx(_rounds_epsilon(3), rel=1e-12)
        assert _ledger(plain / "server" / "ledger.json").spent_at(client, DELTA) == server.spent_at(client, DELTA)


def test_a_run_on_spent_budgets_trains_nothing_and_changes_no_ledger(tmp_path, shared_data_dir):
    budgets = [_rounds_epsilon(2) * 1.001] * 2
    config = _run_config(shared_data_dir, tmp_path, tmp_path / "out", rounds=2)
    run_server(InProcessGrid(config, _nodes(tmp_path, budgets, shared_data_dir)), config)
    files = sorted(tmp_path.rglob("ledger.json"))
    before = {p: p.read_bytes() for p in files if "out" not in p.parts}
    config = {**_run_config(shared_data_dir, tmp_path, tmp_path / "out2", rounds=2), "epsilon-budget": 0.0,
              "target-epsilon": _rounds_epsilon(2) * 1.001, "noise-multiplier": -1.0}
    history = run_server(InProcessGrid(config, _nodes(tmp_path, budgets, shared_data_dir)), config)
    assert history.rounds == [] and "no client can afford" in history.stopped
    assert {p: p.read_bytes() for p in before} == before


class Schedules(RuleBasedStateMachine):
    """Runs (some with lost replies), node restarts and server kills against one state."""

    def __init__(self) -> None:
        super().__init__()
        self.killed = False

    @initialize(budgets=st.lists(st.integers(1, 4), min_size=2, max_size=2))
    def setup(self, budgets):
        self.state = self.tmp / f"case{id(self)}"
        self.budgets = [_rounds_epsilon(k) * 1.001 for k in budgets]  # k rounds fit, k+1 do not
        self.grid = None

    def _grid(self, resume: bool) -> InProcessGrid:
        config = _run_config(self.data_dir, self.state, self.state / "out", rounds=2, resume=resume)
        grid = InProcessGrid(config, _nodes(self.state, self.budgets, self.data_dir))
        if self.grid is not None:  # the same SuperNodes, unless a rule restarted them
            grid.contexts = self.grid.contexts
        self.grid = grid
        return grid

    def _run(self, grid: InProcessGrid) -> None:
        try:
            run_server(grid, grid.run_config)
            self.killed = False
        except ServerKilled:
            self.killed = True

    @rule(lose=st.sampled_from([None, 10, 11]), kill_after=st.sampled_from([None, 1, 3, 4, 5, 7]))
    def new_run(self, lose, kill_after):
        grid = self._grid(resume=False)
        grid.lose = lambda node, message: node == lose
        grid.kill_after = kill_after
        self._run(grid)

    @precondition(lambda self: self.killed)
    @rule()
    def resume(self):
        try:
            self._run(self._grid(resume=True))
        except StateError:  # killed during discovery: nothing was checkpointed or booked
            self.killed = False

    @rule(node=st.sampled_from([10, 11]))
    def restart_node(self, node):
        if self.grid is not None:
            self.grid.restart(node)

    @invariant()
    def no_node_past_its_budget_and_the_server_never_below_a_node(self):
        server_path = self.state / "server" / "ledger.json"
        for i, budget in enumerate(self.budgets):
            path = self.state / f"node{i}" / "ledger.json"
            if not path.exists() or not booked(path.parent):  # no node yet, or nothing booked
                continue
            node = _ledger(path).spent_at(str(i), DELTA)
            assert node <= budget
            assert _ledger(server_path).spent_at(str(i), DELTA) >= node


@pytest.mark.slow
def test_random_schedules_keep_every_budget(tmp_path, shared_data_dir):
    Schedules.tmp, Schedules.data_dir = tmp_path, shared_data_dir
    run_state_machine_as_test(Schedules, settings=settings(
        max_examples=30, stateful_step_count=10, deadline=None, suppress_health_check=list(HealthCheck)))
