"""Resuming a central user-level run (``privacy = "user"``), in process through
``server.run.run_server`` and the real ClientApp: a run killed after round 2 and resumed
ends with the uninterrupted run's model, cohorts, adaptive S and ledgers, each round
booked once; a run killed inside a round books nothing twice either."""

import math

import numpy as np
import pytest

from fedpriv.federation import protocol
from fedpriv.privacy import GaussianEvent, PoissonSampledEvent, PrivacyLedger
from server.run import run_server
from server.state import ServerState, StateError
from server.userlevel import resumed_state
from tests.flower.inprocess import InProcessGrid, ServerKilled, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

NODES, COHORT, ROUNDS, SEED, Z, KILLED_IN = 4, 2, 4, 11, 1.0, 3


def _run_config(data_dir, state, resume=False):
    return {"rounds": ROUNDS, "min-clients": NODES, "limit-train": 20 * NODES, "limit-test": 40, "model": "cnn",
            "data-dir": str(data_dir), "state-dir": str(state / "server"), "privacy": "user", "cohort": COHORT,
            "user-clip": 0.05, "clip-quantile": 0.5, "clip-lr": 0.5, "noise-multiplier": Z,
            "server-randomness": "seeded", "seed": SEED, "lot-size": 10, "lr": 0.1, "epsilon-budget": 100.0,
            "resume": resume}


def _grid(data_dir, state, resume=False, grid_class=InProcessGrid):
    policy = {"epsilon-budget": 100.0, "public-num-examples": True, "allow-central-user": True,
              "data-dir": str(data_dir), "randomness": "seeded", "seed": SEED}
    config = _run_config(data_dir, state, resume)
    return grid_class(config, {10 + i: node_config(i, NODES, state, **policy) for i in range(NODES)}), config


class KilledInRound(InProcessGrid):
    """Killed when round ``KILLED_IN``'s TRAINs are sent, after delivering ``first`` of them."""

    first = 0

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any(m.content.config_records[protocol.CONFIG].get(protocol.SERVER_ROUND) == KILLED_IN
               for m in messages if protocol.CONFIG in m.content.config_records):
            self.kill_after = self.delivered + self.first
        return super().send_and_receive(messages, timeout=timeout)


def _killed_and_resumed(data_dir, state, first):
    grid, config = _grid(data_dir, state, grid_class=type("Killed", (KilledInRound,), {"first": first}))
    with pytest.raises(ServerKilled):
        run_server(grid, config)
    assert ServerState(state / "server").load()[0].completed_round == KILLED_IN - 1
    grid, config = _grid(data_dir, state, resume=True)  # the nodes restart too: new Contexts
    return run_server(grid, config)


def _entries(ledger_path, client):
    return list(PrivacyLedger.load(ledger_path).entries(client))


def test_a_run_stopped_after_a_round_and_resumed_ends_as_the_uninterrupted_one(tmp_path, shared_data_dir):
    grid, config = _grid(shared_data_dir, tmp_path / "plain")
    plain = run_server(grid, config)
    resumed = _killed_and_resumed(shared_data_dir, tmp_path / "killed", first=0)

    assert [r.round for r in resumed.rounds] == list(range(1, ROUNDS + 1))
    assert [r.participants for r in resumed.rounds] == [r.participants for r in plain.rounds]
    clips = [r.train_metrics["user_clip"] for r in plain.rounds]
    assert len(set(clips)) == ROUNDS, "S moves every round: the test needs the checkpointed S"
    assert [r.train_metrics["user_clip"] for r in resumed.rounds] == clips
    assert resumed.resolved["user_level"]["final_clip"] == plain.resolved["user_level"]["final_clip"]
    _, want = ServerState(tmp_path / "plain" / "server").load()
    _, got = ServerState(tmp_path / "killed" / "server").load()
    for name in want:
        np.testing.assert_array_equal(got[name].numpy(), want[name].numpy())

    q = COHORT / NODES
    for i in range(NODES):
        cid = str(i)
        server = PrivacyLedger.load(tmp_path / "killed" / "server" / "ledger.json")
        assert _entries(tmp_path / "killed" / "server" / "ledger.json", cid) == \
            [protocol.train_entry(resumed.run_key, r) for r in range(1, ROUNDS + 1)]  # each round once
        assert server.events(cid) == (PoissonSampledEvent(q, GaussianEvent(Z)),) * ROUNDS
        took_part = [r.round for r in plain.rounds if cid in r.participants]
        assert _entries(tmp_path / "killed" / f"node{i}" / "ledger.json", cid) == \
            [protocol.train_entry(resumed.run_key, r) for r in took_part]
        node = PrivacyLedger.load(tmp_path / "killed" / f"node{i}" / "ledger.json")
        assert node.events(cid) == (GaussianEvent(Z / 2),) * len(took_part)


def test_a_run_killed_inside_a_round_books_that_round_once(tmp_path, shared_data_dir):
    """Killed after one client of round 3 trained: the resumed round 3 is re-sent under the
    same entry; that client refuses to train it twice; no ledger holds an entry twice."""
    resumed = _killed_and_resumed(shared_data_dir, tmp_path, first=1)
    third = resumed.rounds[KILLED_IN - 1]
    assert any("already ran" in reason for reason in third.failed.values())
    for i in range(NODES):
        cid = str(i)
        server = _entries(tmp_path / "server" / "ledger.json", cid)
        assert server == [protocol.train_entry(resumed.run_key, r) for r in range(1, ROUNDS + 1)]
        node = _entries(tmp_path / f"node{i}" / "ledger.json", cid)
        assert len(node) == len(set(node))
        assert set(node) <= set(server)


@pytest.mark.parametrize("state", [{}, {"population": 4}, {"population": 0, "user-clip": 0.5},
                                   {"population": 4, "user-clip": math.nan}, {"population": True, "user-clip": 1.0}])
def test_a_checkpoint_without_user_level_state_is_not_resumed(state):
    with pytest.raises(StateError, match="no user-level state"):
        resumed_state(state)
