"""Local DP-SGD rounds (``privacy = "local"``): each sampled client trains with its own plan
(record-level DP-SGD on its node) and sends its noised model; the server averages the
replies that pass ``server.checks`` (booked charge, shapes, finiteness, the plan's norm
bound), weighted by its own weights (``server.assign``), never by a number a reply reports.
A round with no accepted reply keeps the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message

from fedpriv.federation import protocol
from fedpriv.privacy.charge import Charge
from server.assign import Assignment
from server.booking import Sample
from server.checks import check_train_reply, update_norm_bound
from server.collect import PlainReplies
from server.mechanism import Booking, Collected, Round


class LocalDpSgd:
    """The parts of a local-DP round: a sample booked its plans' events, plain replies
    checked against them, the weighted average."""

    def __init__(self, fraction_train: float = 1.0, seed: int = 0) -> None:
        self.sample = Sample(fraction_train, seed, self.charge)
        self.collector = PlainReplies(self.check)

    def charge(self, assignment: Assignment, entry: str) -> Charge:
        """What a training round costs ``assignment``'s client: its plan's events."""
        return assignment.charge(entry)

    def assigned(self, assignment: Assignment) -> Assignment:
        return assignment

    def book(self, booking: Booking) -> list[int]:
        return self.sample.book(booking)

    def opened(self, rnd: Round) -> None:
        pass

    def train_config(self, rnd: Round, assignment: Assignment) -> dict[str, Any]:
        """The client's plan."""
        return dict(assignment.config)

    def check(self, rnd: Round, assignment: Assignment, reply: Message) -> str | None:
        """``check_train_reply`` against the booked charge and the plan's norm bound."""
        num_params = sum(int(np.prod(a.shape)) for a in rnd.arrays.values())
        bound = update_norm_bound(assignment.plan, assignment.num_examples, num_params)
        return check_train_reply(reply, self.charge(assignment, rnd.entry), rnd.arrays, bound)

    def update(self, rnd: Round, collected: Collected) -> ArrayRecord | None:
        """The weighted average of the accepted models (None when there is none)."""
        if not collected.replies:
            return None
        accepted = sorted(collected.replies, key=lambda item: item[0].client_id)  # sums independent of arrival
        return weighted_average([(a.weight, content.array_records[protocol.ARRAYS]) for a, content in accepted])

    def state(self) -> dict[str, Any]:
        """Nothing: the sampling is drawn per round."""
        return {}

    def resolved(self) -> dict[str, Any]:
        return {}


def weighted_average(weighted: list[tuple[float, ArrayRecord]]) -> ArrayRecord:
    """Σ w_k θ_k / Σ w_k per array (in float64, cast back); one update is returned as it is."""
    if len(weighted) == 1:
        return weighted[0][1]
    total = sum(w for w, _ in weighted)
    first = weighted[0][1]
    out = {}
    for name, array in first.items():
        mean = np.asarray(sum(w * arrays[name].numpy().astype(np.float64) for w, arrays in weighted) / total)
        out[name] = Array(mean.astype(array.numpy().dtype))
    return ArrayRecord(out)
