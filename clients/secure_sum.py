"""A node's answer to one stage of a secure sum (``fedpriv.secagg``) carried by Flower
messages: the stage's config is the message's ``fedpriv.secagg`` ConfigRecord, the node's
protocol state is kept in ``context.state`` (saved even when the node refuses, so a refused
or repeated stage never gets a second answer), and at the collect stage ``contribute`` gives
the vector once every check has passed: a release kind (``clients.release``) whose parse
checks the message against the stage, then books the node's ledger, and whose compute makes
the vector, before anything leaves the node (``contribution``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict

from clients.release import ReleaseKind, release
from fedpriv.federation import protocol
from fedpriv.secagg import RECORD_KEY, NodeState, Requirements, StageInfo, Vector, answer

STATE_KEY = "fedpriv.secagg.state"

Contribute = Callable[[Message, Context, StageInfo], tuple[Vector, RecordDict]]
"""(message, context, what the node saw) → (its vector of Z_{2^bits}, length d, with the
settings it was computed under; what else its reply carries)."""


ContributionKind = ReleaseKind[[Message, Context, StageInfo], Any, Vector]
"""A release kind whose content is a secure sum's vector: ``parse(msg, context, stage)``."""


def contribution(kind: ContributionKind, msg: Message, context: Context, stage: StageInfo) -> tuple[Vector, RecordDict]:
    """``kind``'s vector through the node's one release path (checked, booked, computed) and
    the reply's charge record: a ``Contribute``."""
    vector, charge = release(kind, msg, context, stage)
    return vector, RecordDict({protocol.PRIVACY: protocol.charge_record(charge)})


def is_secure_sum(msg: Message) -> bool:
    """Whether ``msg`` is a stage of a secure sum."""
    return RECORD_KEY in msg.content.config_records


def answer_stage(msg: Message, context: Context, requirements: Requirements, contribute: Contribute) -> RecordDict:
    """The reply content to the secure-sum stage in ``msg``; raises ``SecAggRefusal`` (a
    ValueError) when the node refuses, and whatever ``contribute`` raises."""
    config = msg.content.config_records.get(RECORD_KEY)
    if config is None:
        raise ValueError(f"a secure-sum message carries a {RECORD_KEY!r} config record")
    state = NodeState.from_record(context.state.config_records.get(STATE_KEY))
    extra = RecordDict()

    def vector(info: StageInfo) -> Vector:
        nonlocal extra
        contribution, extra = contribute(msg, context, info)
        return contribution

    try:
        reply = answer(state, requirements, msg.metadata.dst_node_id, dict(config), vector)
    finally:
        context.state.config_records[STATE_KEY] = state.to_record()
    extra.config_records[RECORD_KEY] = ConfigRecord(reply)
    return extra
