"""A node tells "never used" from "lost" (issue 22, items 1, 4 and 6): a node whose ledger was
deleted, never initialised or swapped for another refuses every message, naming what to
restore and no path; ``python -m fedpriv.node init`` works once; a relative state-dir does
not follow the working directory; a corrupt ledger's refusal names no path."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from clients.classic import algorithms as classic_algorithms
from clients.classic import client_app as classic_app
from fedpriv.federation.policy import POLICY_ENV, PolicyError, load_policy
from fedpriv.privacy import PrivacyLedger
from fedpriv.privacy.charge import Charge
from tests.conftest import PROJECT_ROOT, SHARED_DATA
from tests.flower.inprocess import initialised
from tests.flower.metadata import set_metadata
from tests.flower.test_attacks import _evaluate, _query, _train
from tests.timeouts import scaled

pytestmark = pytest.mark.usefixtures("task_identity")
RUN_CONFIG = {"limit-train": 200, "limit-test": 200}
GONE = "initialised but is gone: restore ledger.json from its backup"


def _context(config, run_config=RUN_CONFIG):
    return Context(run_id=1, node_id=5, node_config=config, state=RecordDict(), run_config=dict(run_config))


def _node(state, **policy):
    """An initialised node that trains with N public (so a QUERY books nothing) and evaluates."""
    return initialised({"partition-id": 0, "num-partitions": 2, "state-dir": str(state), "data-dir": str(SHARED_DATA),
                        "epsilon-budget": math.inf, "public-num-examples": True, "allow-evaluate": True, **policy})


def _classic(config, kind):
    content = RecordDict({classic_app.CONFIG: ConfigRecord({"algorithm": kind, "run-key": "run-a", "step": 0,
                                                            "seed": 0, "epsilon": 1.0, "dataset": "iris"}),
                          classic_app.ARRAYS: ArrayRecord()})
    message = Message(content, dst_node_id=5, message_type=MessageType.QUERY)
    set_metadata(message, message_id="m")
    return classic_app.app(message, _context(config))


def _every_message(config):
    """A QUERY, TRAIN and EVALUATE to the DP-SGD app and a request of each classic kind."""
    context = _context(config)
    yield from (("query", _query(context)), ("train", _train(context)), ("evaluate", _evaluate(context)))
    for kind in classic_algorithms.RELEASES:
        yield kind, _classic(config, kind)


def _refusals(config, state):
    reasons = {}
    for name, reply in _every_message(config):
        assert reply.has_error(), f"{name} was answered"
        reasons[name] = reply.error.reason
        assert str(state) not in reply.error.reason and "\n" not in reply.error.reason
    return reasons


def test_a_node_whose_ledger_was_deleted_refuses_every_message_and_names_no_path(tmp_path):
    config = _node(tmp_path / "node")
    assert not _query(_context(config)).has_error()  # the node answers while its ledger is there
    (tmp_path / "node" / "ledger.json").unlink()  # a lost disk, a tmpfs after reboot, a partial restore
    reasons = _refusals(config, tmp_path)
    assert all(GONE in reason for reason in reasons.values()), reasons
    assert not (tmp_path / "node" / "ledger.json").exists()  # no empty ledger started over the lost one


def test_a_node_never_initialised_refuses_and_says_how_to_initialise(tmp_path):
    config = {"partition-id": 0, "num-partitions": 2, "state-dir": str(tmp_path / "node"),
              "data-dir": str(SHARED_DATA), "epsilon-budget": math.inf, "public-num-examples": True}
    reasons = _refusals(config, tmp_path)
    assert all("not initialised: run `python -m fedpriv.node init" in r for r in reasons.values()), reasons
    assert not (tmp_path / "node" / "ledger.json").exists()


def test_a_ledger_restored_from_another_nodes_backup_is_refused_its_own_is_accepted(tmp_path):
    mine, other = _node(tmp_path / "mine"), _node(tmp_path / "other")
    backup = tmp_path / "backup.json"
    shutil.copy(tmp_path / "mine" / "ledger.json", backup)
    assert not _train(_context(other)).has_error()  # the other node's ledger holds a training
    shutil.copy(tmp_path / "other" / "ledger.json", tmp_path / "mine" / "ledger.json")  # the wrong backup
    reasons = _refusals(mine, tmp_path)
    assert all("not the one it was initialised with" in r for r in reasons.values()), reasons
    shutil.copy(backup, tmp_path / "mine" / "ledger.json")  # its own backup: it answers again
    assert not _train(_context(mine)).has_error()


def _init(policy, cwd, *partition):
    return subprocess.run([sys.executable, "-m", "fedpriv.node", "init", "--policy", str(policy), *partition],
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, capture_output=True, text=True,
                          check=False)


def test_init_works_once_and_refuses_a_second_time_even_from_another_folder(tmp_path):
    # a relative state-dir in a policy file is the policy file's folder's: one ledger, whatever the cwd
    (tmp_path / "etc").mkdir()
    (tmp_path / "elsewhere").mkdir()
    policy = tmp_path / "etc" / "policy.toml"
    policy.write_text('epsilon-budget = inf\nstate-dir = "state/{partition-id}"\npublic-num-examples = true\n')
    first = _init(policy, tmp_path, "--partition-id", "1")
    assert first.returncode == 0, first.stderr
    ledger = PrivacyLedger.load(tmp_path / "etc" / "state" / "1" / "ledger.json")
    assert ledger.ledger_id and not ledger.clients()
    node = {"policy": str(policy), "partition-id": 1, "num-partitions": 2, "data-dir": str(SHARED_DATA)}
    assert not _train(_context(node)).has_error()  # an initialised node trains
    booked = (tmp_path / "etc" / "state" / "1" / "ledger.json").read_bytes()
    for cwd in (tmp_path, tmp_path / "elsewhere"):
        again = _init(policy, cwd, "--partition-id", "1")
        assert again.returncode == 2 and again.stdout == ""
        assert again.stderr.count("\n") == 1 and "initialised already" in again.stderr
    assert (tmp_path / "etc" / "state" / "1" / "ledger.json").read_bytes() == booked  # untouched
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("ledger.json")) == \
        [(tmp_path / "etc" / "state" / "1" / "ledger.json").relative_to(tmp_path)]


def test_a_relative_state_dir_never_follows_the_working_directory(tmp_path, monkeypatch):
    policy = tmp_path / "policy.toml"
    policy.write_text('epsilon-budget = 1.0\nstate-dir = "nodes/{partition-id}"\ndata-dir = "data"\n')
    seen = []
    for cwd in (tmp_path, tmp_path / "nodes"):
        cwd.mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        named = "policy.toml" if cwd == tmp_path else str(policy)  # the file named relative to the cwd, or not
        loaded = load_policy({"partition-id": 1}, environ={POLICY_ENV: named})
        seen.append((loaded.state_dir, loaded.data_dir))
    assert seen == [(tmp_path / "nodes" / "1", tmp_path / "data")] * 2
    for key in ("state-dir", "data-dir"):  # --node-config has no folder of its own: refused
        with pytest.raises(PolicyError, match=f"'{key}' must be an absolute path"):
            load_policy({"epsilon-budget": 1.0, "state-dir": str(tmp_path), key: "relative/x"}, environ={})


@pytest.mark.parametrize("corrupt", ["ledger.json", "releases.json"])
def test_a_corrupt_ledger_is_refused_without_naming_its_path(tmp_path, corrupt):
    config = _node(tmp_path / "node", **{"public-num-examples": False})
    (tmp_path / "node" / corrupt).write_text("{ not json")
    reply = _query(_context(config))
    assert reply.has_error() and f"corrupt {corrupt.split('.')[0]}" in reply.error.reason
    assert str(tmp_path) not in reply.error.reason


@pytest.mark.slow
@pytest.mark.cluster
def test_a_simulated_node_whose_ledger_was_lost_refuses_while_the_other_trains_on(tmp_path, shared_data_dir):
    state = tmp_path / "state"

    def run(out):
        done = subprocess.run([sys.executable, "-m", "simulations.mnist", "--clients", "2", "--rounds", "1",
                               "--limit-train", "400", "--limit-test", "100", "--lot-size", "64", "--model", "cnn",
                               "--data-dir", str(shared_data_dir), "--state-dir", str(state), "--out", str(out)],
                              cwd=PROJECT_ROOT, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
                              capture_output=True, text=True, timeout=scaled(600), check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads((out / "results.json").read_text()), done.stdout + done.stderr

    first, _ = run(tmp_path / "out0")
    assert first["rounds"][0]["participants"] == ["0", "1"]
    (state / "nodes" / "0" / "ledger.json").unlink()
    second, log = run(tmp_path / "out1")
    assert second["rounds"][0]["participants"] == ["1"] and list(second["final_epsilon"]) == ["1"]
    assert GONE in log and not (state / "nodes" / "0" / "ledger.json").exists()
    node1 = PrivacyLedger.load(state / "nodes" / "1" / "ledger.json")
    assert len(node1.entries("1")) == 2  # a round in each run


def test_booking_into_a_ledger_gone_after_the_handlers_check_starts_no_empty_one(tmp_path):
    from clients.releases import Refusal, book
    from fedpriv.privacy import Budget, GaussianEvent

    policy = load_policy(_node(tmp_path / "node"), environ={})
    (tmp_path / "node" / "ledger.json").unlink()  # between the handler's check and its booking
    with pytest.raises(Refusal, match="not initialised or is gone"):
        book(policy, "0", Charge("run-a/round-1/train", (GaussianEvent(1.0),)), Budget(math.inf, 1e-5))
    assert not (tmp_path / "node" / "ledger.json").exists()
