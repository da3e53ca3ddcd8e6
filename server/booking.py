"""Who is booked, and when: the two ways a round's members are chosen and booked before
anything is sent (``server.mechanism.Mechanism.book``).

- ``Sample`` (local and distributed training, and every mode's federated evaluation): a
  seeded uniform sample of ⌊fraction · known clients⌋ (at least one) of the online clients
  whose ledger can afford the entry; each is booked its own charge.
- ``book_population`` (user level): every known client that can afford the round is booked,
  sampled or not; the mode then draws its cohort from that population.

Booking is idempotent per entry (an entry booked before counts as affordable and is not
counted twice), so a resumed round is not charged again.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from logging import INFO, WARNING
from typing import Any

from flwr.supercore import log

from fedpriv.privacy import BudgetExceededError, LedgerError, PrivacyLedger
from fedpriv.privacy.charge import Charge
from fedpriv.seeding import derive_seed
from server.assign import Assignment
from server.mechanism import Booking

ChargeOf = Callable[[Assignment, str], Charge]
"""``charge(assignment, entry)``: what ``entry`` costs that assignment's client."""


class BudgetExhausted(Exception):
    """No known client can afford another round: the run stops here."""


class Sample:
    """A seeded sample of the affordable online clients, each booked ``charge`` (``stream``:
    the seed's stream, one draw per round; ``evaluate``: only nodes that answer EVALUATE
    are eligible, and none eligible is no error)."""

    def __init__(self, fraction: float, seed: int, charge: ChargeOf, evaluate: bool = False) -> None:
        self.fraction, self.seed, self.charge, self.evaluate = fraction, seed, charge, evaluate
        self._afford: dict[tuple[Any, ...], bool] = {}

    def affordable(self, ledger: PrivacyLedger, nodes: Iterable[tuple[int, Assignment]], entry: str) -> list[int]:
        """Node ids whose client can still afford ``entry`` (already booked counts as
        affordable: re-sending it costs nothing more), by client id."""
        ok = [(n, a) for n, a in nodes
              if (a.evaluate_events or not self.evaluate) and self._can_afford(ledger, a, entry)]
        return [n for n, _ in sorted(ok, key=lambda item: item[1].client_id)]

    def _can_afford(self, ledger: PrivacyLedger, a: Assignment, entry: str) -> bool:
        """``ledger.can_afford``, memoised on (history, events, budget): clients with the
        same history share one accountant call (RDP at large q takes ~0.5 s)."""
        if ledger.has_entry(a.client_id, entry):
            return True
        events = self.charge(a, entry).events
        key = (ledger.events(a.client_id), events, ledger.budget_for(a.client_id))
        if key not in self._afford:
            self._afford[key] = ledger.can_afford(a.client_id, events)
        return self._afford[key]

    def book(self, booking: Booking) -> list[int]:
        """Sample affordable online nodes and book their entries; ``BudgetExhausted`` for
        training when no known client can afford the round."""
        nodes = booking.nodes
        eligible = self.affordable(booking.ledger, nodes.items(), booking.entry)
        if not eligible and not self.evaluate:
            raise BudgetExhausted(f"round {booking.server_round}: no client can afford another round")
        eligible = [n for n in eligible if n in booking.online]
        size = min(len(eligible), max(1, int(len(nodes) * self.fraction)))
        stream = "server-evaluate" if self.evaluate else "server-sampling"
        rng = random.Random(derive_seed(self.seed, stream, booking.server_round))
        booked = []
        for node in sorted(rng.sample(eligible, size), key=lambda n: nodes[n].client_id):
            charge = self.charge(nodes[node], booking.entry)
            try:
                booking.ledger.record(nodes[node].client_id, charge.entry, charge.events)
            except LedgerError as err:  # a resumed round booked with other events
                log(WARNING, "Client %s not sent %s: %s", nodes[node].client_id, booking.entry, err)
                continue
            booked.append(node)
        log(INFO, "configure_%s: %d of %d affordable clients sampled (%d known)",
            "evaluate" if self.evaluate else "train", len(booked), len(eligible), len(nodes))
        return booked


def book_population(booking: Booking, ordered: Sequence[int], charge: Charge) -> list[int]:
    """Book ``charge`` for each node of ``ordered`` whose client can afford it: the population
    (a client over its budget is out of it from now on); ``BudgetExhausted`` when none can."""
    population = []
    for node in ordered:
        cid = booking.nodes[node].client_id
        try:
            booking.ledger.record(cid, charge.entry, charge.events)
        except BudgetExceededError:
            continue
        except LedgerError as err:  # booked with other events (another run's settings)
            log(WARNING, "Client %s left out of %s: %s", cid, charge.entry, err)
            continue
        population.append(node)
    if not population:
        raise BudgetExhausted(f"round {booking.server_round}: no client can afford another round")
    return population
