"""What a node tells the server when an answer fails: after a release is booked, a fixed
text only (a failure's own text, e.g. a shape error, can hold the exact size of the node's
data, which its ledger covers only by a noisy count); the details go to the node's log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from fedpriv.federation import protocol

log = logging.getLogger(__name__)


class ReleaseFailed(Exception):
    """A booked release failed; its text is fixed (``protocol.FAILED_AFTER_BOOKING``)."""

    def __init__(self) -> None:
        super().__init__(protocol.FAILED_AFTER_BOOKING)


@contextmanager
def after_booking(entry: str) -> Iterator[None]:
    """Run the part of an answer that follows its booking: any exception is logged here in
    full and leaves as ``ReleaseFailed`` (no cause or context attached)."""
    try:
        yield
    except Exception:
        log.exception("the release %s failed after it was booked; nothing was sent", entry)
        raise ReleaseFailed() from None
