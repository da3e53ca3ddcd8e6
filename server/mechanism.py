"""The parts a privacy mode supplies to the one round loop (``server.strategy.PrivateFedAvg``).

The loop is the same for every mode: admit new nodes → book (``Mechanism.book``: who is
booked and what, in one ledger transaction, before anything is sent) → open the round's
log (``opened``) → collect (``collector``: the members' plain replies, each checked, or
the secure sum of their vectors, decoded) → close the round (accept-failures, ε logged) →
update the model (``update``). A mode is one ``Mechanism``; as Opacus' ``DPOptimizer``
subclasses override one stage of ``pre_step``, a mode changes only its own parts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp import Grid

from fedpriv.privacy import PrivacyLedger
from server.assign import Assignment
from server.history import RoundLog


@dataclass(frozen=True)
class Booking:
    """What ``Mechanism.book`` books in: the open ledger transaction, the known nodes, the
    round's entry and the nodes online now."""

    ledger: PrivacyLedger
    nodes: Mapping[int, Assignment]
    entry: str
    server_round: int
    online: frozenset[int]


@dataclass(frozen=True)
class Round:
    """A round in progress: its entry, the global model it starts from, its cohort (node →
    assignment, in the order the mode booked them) and its log."""

    number: int
    entry: str
    arrays: ArrayRecord
    cohort: Mapping[int, Assignment]
    log: RoundLog


@dataclass
class Collected:
    """What a round's collection gave: ``contributions`` (the clients it holds), and either
    the checked replies' contents (plain) or the decoded secure sum over ``survivors``."""

    contributions: int
    replies: list[tuple[Assignment, RecordDict]] = field(default_factory=list)
    decoded: torch.Tensor | None = None
    survivors: list[Assignment] = field(default_factory=list)
    reason: str | None = None
    """Secure sum only: why ``decoded`` is None (the round holds no sum)."""


Content = Callable[[int], RecordDict]
"""``content(node)``: the message content of one member of the round."""


class Collector(Protocol):
    """How the round's replies are collected (``server.collect``: plain or secure)."""

    def collect(self, grid: Grid, rnd: Round, content: Content, timeout: float | None) -> Collected:
        """Send each member of ``rnd.cohort`` its ``content``; what came back, its failures and
        rejections written to ``rnd.log``."""
        ...


class Mechanism(Protocol):
    """One privacy mode's parts of the round loop."""

    @property
    def collector(self) -> Collector:
        """How the round's replies are collected."""
        ...

    def assigned(self, assignment: Assignment) -> Assignment:
        """The assignment a node runs in this mode (as discovered, or the mode's one plan)."""
        ...

    def book(self, booking: Booking) -> list[int]:
        """Book the round (who: the sample, or the population; what: the server's events) and
        return the cohort to ask; ``BudgetExhausted`` when no client can afford it."""
        ...

    def opened(self, rnd: Round) -> None:
        """The round's cohort is known and its log open (what the mode records or fixes then)."""
        ...

    def train_config(self, rnd: Round, assignment: Assignment) -> dict[str, Any]:
        """What the round's message to ``assignment``'s node carries besides the round and run key."""
        ...

    def update(self, rnd: Round, collected: Collected) -> ArrayRecord | None:
        """The new global model (None: the model stays) from what the round collected."""
        ...

    def state(self) -> dict[str, Any]:
        """What a resumed run needs of the mode beyond the model, history and ledger."""
        ...

    def resolved(self) -> dict[str, Any]:
        """What ``results.json``'s ``resolved`` adds for this mode."""
        ...
