"""``python -m simulations.classic ... --clients K`` (and ``simulations.dpdropout``) whose
nodes all fail (issue 38: every Ray worker killed, e.g. out of memory, and the run printed
a metric of 0.333 and exited 0): it exits non-zero with one line saying what failed, and
prints no metric. The nodes fail as Flower's simulation engine reports a dead worker: an
error reply to each message."""

import pytest
from flwr.app import Error, Message
from flwr.common.constant import ErrorCode

import simulations._classic_nodes as classic_nodes
from simulations import classic
from tests.flower.metadata import set_metadata

DIED = "<class 'ray.exceptions.ActorDiedError'>:<'The actor died unexpectedly before finishing this task.\n\tclass_name"


class _DeadWorkers:
    """A Grid of ``nodes`` nodes whose every ClientApp died: each message gets an error reply."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(range(1, self.nodes + 1))

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        replies = []
        for i, message in enumerate(messages):
            set_metadata(message, message_id=f"m{i}")
            reply = Message(Error(code=ErrorCode.UNKNOWN, reason=DIED), reply_to=message)
            replies.append(set_metadata(reply, src_node_id=message.metadata.dst_node_id))
        return replies


@pytest.fixture
def dead_workers(monkeypatch, task_identity):
    def run_on_nodes(prog, server, clients, policy):
        server(_DeadWorkers(clients))
        return dict.fromkeys(map(str, range(clients)))  # nothing booked

    monkeypatch.setattr(classic_nodes, "run_on_nodes", run_on_nodes)


@pytest.mark.parametrize("algorithm", ["output-perturbation", "linreg"])
def test_a_run_whose_nodes_all_died_exits_non_zero_without_a_metric(algorithm, dead_workers, capsys):
    with pytest.raises(SystemExit) as exit_:
        classic.main([algorithm, "--epsilon", "1", "--clients", "2"])
    message = exit_.value.code
    assert message == (f"python -m simulations.classic: all 2 nodes failed, so no metric (it would be the initial "
                       f"model's): {DIED.splitlines()[0]}")
    assert "metric" not in capsys.readouterr().out


def test_a_dpdropout_run_whose_nodes_all_died_exits_non_zero(dead_workers):
    from simulations import dpdropout

    with pytest.raises(SystemExit, match="^python -m simulations.dpdropout: all 2 nodes failed"):
        dpdropout.main(["--dataset", "digits", "--epsilon", "1", "--clients", "2", "--epochs", "1"])


def test_one_accepted_share_is_an_answer():
    from server.classic.loops import Shares

    classic_nodes.check_answered("prog", Shares(events={"1": []}, refused={"2": DIED}), 2)
    with pytest.raises(SystemExit, match="no node replied"):
        classic_nodes.check_answered("prog", Shares(), 2)
