"""Flatten an event into counted *steps* for the closed-form accountants.

A step is one basic mechanism (Gaussian, Laplace or distributed discrete Gaussian) applied
to a Poisson subsample with rate q (q = 1: the whole data set). ``flatten`` returns {step: count}; SelfComposed
multiplies counts, Composed adds them. Sampling of anything but a single basic mechanism is
unsupported here (dp-accounting's PLD has the same rule).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import singledispatch

from fedpriv.privacy.accountants.base import UnsupportedEventError
from fedpriv.privacy.events import (
    ComposedEvent,
    DistributedDiscreteGaussianEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
)

Mechanism = GaussianEvent | LaplaceEvent | DistributedDiscreteGaussianEvent
_MECHANISMS = (GaussianEvent, LaplaceEvent, DistributedDiscreteGaussianEvent)


@dataclass(frozen=True)
class Step:
    """``mechanism`` run on a Poisson subsample with rate ``sample_rate``."""

    mechanism: Mechanism
    sample_rate: float = 1.0


def flatten(event: object) -> Counter[Step]:
    """{step: count} for ``event``; raises ``UnsupportedEventError``; steps with count
    0 or sample rate 0 cost nothing and are dropped."""
    steps: Counter[Step] = Counter()
    _walk(event, 1, steps)
    return Counter({s: n for s, n in steps.items() if n > 0 and s.sample_rate > 0})


@singledispatch
def _walk(event: object, count: int, out: Counter[Step]) -> None:
    raise UnsupportedEventError(f"not a fedpriv privacy event: {event!r}")


@_walk.register
def _(event: GaussianEvent, count: int, out: Counter[Step]) -> None:
    out[Step(event)] += count


@_walk.register
def _(event: LaplaceEvent, count: int, out: Counter[Step]) -> None:
    out[Step(event)] += count


@_walk.register
def _(event: DistributedDiscreteGaussianEvent, count: int, out: Counter[Step]) -> None:
    out[Step(event)] += count


@_walk.register
def _(event: PoissonSampledEvent, count: int, out: Counter[Step]) -> None:
    if not isinstance(event.event, _MECHANISMS):
        raise UnsupportedEventError(
            f"only a single Gaussian, Laplace or distributed discrete Gaussian mechanism can be Poisson-sampled "
            f"here, got {event!r}"
        )
    out[Step(event.event, event.sample_rate)] += count


@_walk.register
def _(event: SelfComposedEvent, count: int, out: Counter[Step]) -> None:
    _walk(event.event, count * event.count, out)


@_walk.register
def _(event: ComposedEvent, count: int, out: Counter[Step]) -> None:
    for inner in event.events:
        _walk(inner, count, out)
