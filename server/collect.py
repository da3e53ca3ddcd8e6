"""How a round's replies are collected (``server.mechanism.Collector``):

- ``PlainReplies``: one message per member; a reply counts only if it answers a message
  sent this round, from the node it was sent to, for the first time (no duplicates, no
  stale rounds), and passes the mode's ``check``. A rejected reply is logged with the
  client id and reason; a member that refused, errored or sent nothing in time failed.
- ``SecureSum``: the members' vectors summed by secure aggregation (``server.secure_sum``)
  on the lattice the mode names for the round, and the sum decoded; a member that is not
  among the survivors failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING

from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedpriv.distributed.contribution import decode_sum
from fedpriv.distributed.lattice import Lattice
from fedpriv.secagg import graph
from server.assign import Assignment
from server.exchange import send_and_receive
from server.history import RoundLog
from server.mechanism import Collected, Content, Round
from server.secure_sum import secure_sum

NO_REPLY = "no reply (the node crashed or left, or passed the round timeout); its round stays booked"

Check = Callable[[Round, Assignment, Message], "str | None"]
"""``check(round, assignment, reply)``: why the reply cannot be used, or None when it can."""


@dataclass(frozen=True)
class Sent:
    """A message this round sent, and to whom."""

    assignment: Assignment
    message: Message


def answers(sent: Mapping[int, Sent], replies: Iterable[Message],
            round_log: RoundLog) -> Iterator[tuple[Sent, Message]]:
    """(what was sent, its reply) for each first reply to a message of this round; the
    rest (unexpected node, stale or unknown message, duplicate) logged and dropped; a
    member that refused, errored or never answered is written to ``round_log.failed``."""
    seen: set[int] = set()
    for reply in replies:
        node = reply.metadata.src_node_id
        message = sent.get(node)
        if message is None or reply.metadata.reply_to_message_id != message.message.metadata.message_id:
            log(WARNING, "Ignoring a reply from node %d that answers no message of round %d", node, round_log.round)
            continue
        cid = message.assignment.client_id
        if node in seen:
            round_log.rejected.setdefault(cid, "duplicate reply")
            log(WARNING, "Rejected a duplicate reply of client %s", cid)
            continue
        seen.add(node)
        if reply.has_error():
            round_log.failed[cid] = f"[{reply.error.code}] {reply.error.reason}"
            log(INFO, "Client %s did not answer: %s", cid, round_log.failed[cid])
            continue
        yield message, reply
    for node in sent.keys() - seen:
        cid = sent[node].assignment.client_id
        round_log.failed[cid] = NO_REPLY
        log(INFO, "Client %s did not answer: %s", cid, NO_REPLY)


@dataclass(frozen=True)
class PlainReplies:
    """Each member's reply as it is, used only when ``check`` passes it (``what``: the word
    for a reply in the log)."""

    check: Check
    message_type: str = MessageType.TRAIN
    what: str = "update"

    def collect(self, grid: Grid, rnd: Round, content: Content, timeout: float | None) -> Collected:
        sent = {node: Sent(a, Message(content(node), node, self.message_type)) for node, a in rnd.cohort.items()}
        replies = send_and_receive(grid, [s.message for s in sent.values()], timeout)
        accepted: list[tuple[Assignment, RecordDict]] = []
        for message, reply in answers(sent, replies, rnd.log):
            a = message.assignment
            problem = self.check(rnd, a, reply)
            if problem:
                rnd.log.rejected[a.client_id] = problem
                log(WARNING, "Rejected %s of client %s: %s", self.what, a.client_id, problem)
            else:
                accepted.append((a, reply.content))
        return Collected(len(accepted), replies=accepted)


@dataclass(frozen=True)
class SecureSum:
    """The members' vectors on ``lattice(round)``, summed by SecAgg+ on a graph of
    ``neighbours`` per node (0: the full graph), and decoded; the survivors recorded."""

    lattice: Callable[[Round], Lattice]
    neighbours: int

    def collect(self, grid: Grid, rnd: Round, content: Content, timeout: float | None) -> Collected:
        if not rnd.cohort:
            return Collected(0, reason="no client sampled")
        lattice = self.lattice(rnd)
        cohort = list(rnd.cohort)
        result = secure_sum(grid, cohort, dimension=lattice.dimension, modulus_bits=lattice.modulus_bits,
                            threshold=graph.threshold(len(cohort), self.neighbours), collect_content=content,
                            timeout=timeout, round_key=rnd.entry, neighbours=self.neighbours)
        for node in cohort:
            if node not in result.survivors:
                rnd.log.failed[rnd.cohort[node].client_id] = result.dropped.get(node, "not among the survivors")
        survivors = [rnd.cohort[n] for n in result.survivors]
        rnd.log.survivors = [a.client_id for a in survivors]
        if result.sum is None:
            return Collected(len(survivors), survivors=survivors,
                             reason=f"secure aggregation gave no sum: {result.reason}")
        return Collected(len(survivors), decoded=decode_sum(result.sum, lattice), survivors=survivors)
