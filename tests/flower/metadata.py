"""The one place tests set what Flower's transport sets on a message in transit (its id,
its source node): ``Metadata`` exposes both read-only, so this writes its private fields.
``tests/test_flower_private.py`` fails by name if a Flower upgrade renames them."""

from __future__ import annotations

from flwr.app import Message


def set_metadata(message: Message, *, message_id: str | None = None, src_node_id: int | None = None) -> Message:
    """``message`` with the given id and/or source node, as if it had been delivered."""
    fields = vars(message.metadata)
    if message_id is not None:
        fields["_message_id"] = message_id
    if src_node_id is not None:
        fields["_src_node_id"] = src_node_id
    return message

