"""Send messages to nodes and collect their replies.

The Grid of a deployed ServerApp (Flower's ``HttpGrid``) sleeps 3 s between pulls in its
``send_and_receive``: each exchange (discovery, every training and evaluation round) then
ends up to 3 s after its last reply came in. For that Grid the replies are pulled every
``PULL_INTERVAL_S`` (the in-memory Grid's interval) instead, so that a deployment's round
is as short as its slowest node; every other Grid keeps its own ``send_and_receive``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

SLOW_POLLING_GRIDS: tuple[type[Grid], ...]
try:  # the deployed ServerApp's Grid in flwr 1.41; another Flower may name or place it differently
    from flwr.superlink.grid import HttpGrid

    SLOW_POLLING_GRIDS = (HttpGrid,)
except ImportError:  # then every Grid keeps its own send_and_receive (correct, only slower)
    SLOW_POLLING_GRIDS = ()

PULL_INTERVAL_S = 0.1
"""Seconds between pulls while replies are outstanding (Flower's in-memory Grid's interval)."""


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
    """Push ``messages``; the replies that arrived before all came in or ``timeout`` s passed
    (None: wait for every one). A reply answers one pushed message; nodes that never reply
    are the caller's to notice."""
    if not isinstance(grid, SLOW_POLLING_GRIDS):
        return list(grid.send_and_receive(messages, timeout=timeout))
    waiting = set(grid.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    while waiting:
        arrived = list(grid.pull_messages(waiting))
        replies.extend(arrived)
        waiting -= {reply.metadata.reply_to_message_id for reply in arrived}
        if not waiting or (deadline is not None and time.monotonic() >= deadline):
            break
        time.sleep(PULL_INTERVAL_S)
    return replies
