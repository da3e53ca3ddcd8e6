"""Drive one secure sum (``fedpriv.secagg.SecureAggregation``) over a Flower Grid: each stage
is a TRAIN message per live node carrying the stage's ``fedpriv.secagg`` ConfigRecord (the
collect stage also carries ``collect_content(node)``: the model and the plan), sent with
``server.exchange.send_and_receive`` and a timeout per stage. A reply that answers no message
of the stage, comes from another node or repeats one is ignored; an error reply drops its
node; everything else is checked by the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from logging import INFO, WARNING
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedpriv.secagg import RECORD_KEY, SecureAggregation, SecureSumResult, Stage
from server.exchange import send_and_receive


def secure_sum(grid: Grid, nodes: Sequence[int], *, dimension: int, modulus_bits: int, threshold: int,
               collect_content: Callable[[int], RecordDict], timeout: float | None,
               round_key: str, neighbours: int = 0) -> SecureSumResult:
    """The modular sum of the vectors of the ``nodes`` that survive the five stages (or None,
    with the reason, when the round must be discarded), on SecAgg+'s graph of ``neighbours``
    per node (0: the full graph); ``extras`` holds each survivor's reply content beside its
    masked vector."""
    aggregation = SecureAggregation(nodes, dimension=dimension, modulus_bits=modulus_bits, threshold=threshold,
                                    round_key=round_key, neighbours=neighbours)
    extras: dict[int, RecordDict] = {}
    while not aggregation.done:
        stage = aggregation.current()
        sent: dict[int, Message] = {}
        for node, config in aggregation.requests().items():
            content = collect_content(node) if stage is Stage.COLLECT else RecordDict()
            content.config_records[RECORD_KEY] = ConfigRecord(config)
            sent[node] = Message(content, dst_node_id=node, message_type=MessageType.TRAIN, group_id=round_key)
        replies: dict[int, dict[str, Any]] = {}
        for node, reply in _answers(send_and_receive(grid, sent.values(), timeout), sent, stage):
            if reply.has_error():
                aggregation.drop(node, f"[{reply.error.code}] {reply.error.reason}")
                continue
            record = reply.content.config_records.get(RECORD_KEY)
            replies[node] = dict(record) if record is not None else {}
            if stage is Stage.COLLECT:
                del reply.content.config_records[RECORD_KEY]
                extras[node] = reply.content
        aggregation.receive(replies)
        log(INFO, "secure sum %s: %s answered by %d of %d nodes", round_key, stage, len(aggregation.live), len(sent))
    result = aggregation.result()
    result.extras = {node: extras[node] for node in result.survivors}
    if result.sum is None:
        log(WARNING, "secure sum %s discarded: %s", round_key, result.reason)
    return result


def _answers(replies: list[Message], sent: dict[int, Message], stage: Stage) -> list[tuple[int, Message]]:
    """(node, reply) for the first reply of each node to the message it was sent."""
    seen: set[int] = set()
    answers = []
    for reply in replies:
        node = reply.metadata.src_node_id
        message = sent.get(node)
        if message is None or reply.metadata.reply_to_message_id != message.metadata.message_id or node in seen:
            log(WARNING, "Ignoring a reply from node %d that answers no %s message of this secure sum", node, stage)
            continue
        seen.add(node)
        answers.append((node, reply))
    return answers
