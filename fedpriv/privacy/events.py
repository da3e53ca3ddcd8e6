"""Privacy events: what a mechanism *did*, from which any accountant derives its cost.

fedpriv never stores or passes an ε as the source of truth. Training code reports events,
the ledger stores them, and an accountant turns them into (ε, δ) on demand. The types
mirror dp-accounting's ``DpEvent`` family (frozen, nestable) and add a JSON form so a
ledger can be persisted, audited and re-analysed with a different accountant later.

Conventions (the same as dp-accounting and Opacus):
- Neighbouring data sets differ by adding or removing one example.
- ``GaussianEvent(σ)``: noise N(0, σ²Δ²) added to a query of L2 sensitivity Δ.
- ``LaplaceEvent(b)``: noise Laplace(bΔ₁) on a query of L1 sensitivity Δ₁; it is
  pure (1/b)-DP.
- ``PoissonSampledEvent(q, e)``: ``e`` run on a subset holding each example with
  probability q, independently.
- ``SelfComposedEvent(e, n)``: ``e`` run ``n`` times (adaptively).
- ``ComposedEvent((e1, e2, ...))``: each of the events run once (adaptively).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dp_accounting


class EventError(ValueError):
    """An event is malformed or its JSON form cannot be read."""


def _check_finite_nonneg(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise EventError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise EventError(f"{name} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class GaussianEvent:
    """Gaussian mechanism with noise standard deviation ``noise_multiplier`` × sensitivity.

    ``noise_multiplier == 0`` is allowed: it records a non-private release (ε = ∞).
    """

    noise_multiplier: float

    def __post_init__(self) -> None:
        _check_finite_nonneg("noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True)
class LaplaceEvent:
    """Laplace mechanism with scale ``noise_multiplier`` × L1 sensitivity: pure ε = 1/b."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        _check_finite_nonneg("noise_multiplier", self.noise_multiplier)

    @classmethod
    def from_epsilon(cls, epsilon: float) -> LaplaceEvent:
        """The Laplace mechanism that is pure ``epsilon``-DP."""
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise EventError(f"epsilon must be finite and > 0, got {epsilon!r}")
        return cls(1.0 / epsilon)


@dataclass(frozen=True)
class PoissonSampledEvent:
    """``event`` applied to a Poisson subsample with rate ``sample_rate`` in [0, 1]."""

    sample_rate: float
    event: DpEvent

    def __post_init__(self) -> None:
        _check_finite_nonneg("sample_rate", self.sample_rate)
        if self.sample_rate > 1:
            raise EventError(f"sample_rate must be in [0, 1], got {self.sample_rate!r}")
        _check_event(self.event)


@dataclass(frozen=True)
class SelfComposedEvent:
    """``event`` composed with itself ``count`` times."""

    event: DpEvent
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 0:
            raise EventError(f"count must be an integer >= 0, got {self.count!r}")
        _check_event(self.event)


@dataclass(frozen=True)
class ComposedEvent:
    """Each of ``events`` applied once, in sequence."""

    events: tuple[DpEvent, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.events, tuple):
            raise EventError("ComposedEvent.events must be a tuple")
        for event in self.events:
            _check_event(event)


DpEvent = GaussianEvent | LaplaceEvent | PoissonSampledEvent | SelfComposedEvent | ComposedEvent
_EVENT_TYPES = (GaussianEvent, LaplaceEvent, PoissonSampledEvent, SelfComposedEvent, ComposedEvent)


def _check_event(event: object) -> None:
    if not isinstance(event, _EVENT_TYPES):
        raise EventError(f"not a privacy event: {event!r}")


SAMPLER_BITS = 53
"""fedpriv's Poisson samplers (``fedpriv.dpsgd.sampling``) draw a uniform k in [0, 2⁵³) per
example and keep it iff k < ⌊q·2⁵³⌋: the rate they realise is ⌊q·2⁵³⌋/2⁵³ ≤ q, never above
the q that is booked (ε grows with q)."""

MIN_SAMPLE_RATE = 2.0**-33
"""The smallest q a DP-SGD event may carry (about 1.2e-10, one record in 8.6e9): from it up
the realised rate is within a relative 2⁻²⁰ of q; below it the samplers cannot draw q
faithfully (nothing at all under 2⁻⁵³), and such a request is an error or an attack."""


def check_sample_rate(sample_rate: float, name: str = "sample_rate",
                      error: type[ValueError] = EventError) -> float:
    """``sample_rate`` if the samplers draw it faithfully (``MIN_SAMPLE_RATE`` ≤ q ≤ 1), else ``error``."""
    if not isinstance(sample_rate, (int, float)) or isinstance(sample_rate, bool) or math.isnan(sample_rate):
        raise error(f"{name} must be a number, got {sample_rate!r}")
    if not MIN_SAMPLE_RATE <= sample_rate <= 1:
        raise error(f"{name} must be in [2^-33, 1] (the rates the Poisson samplers draw faithfully), got "
                    f"{sample_rate!r}")
    return sample_rate


def dpsgd_event(noise_multiplier: float, sample_rate: float, steps: int) -> DpEvent:
    """The event of ``steps`` DP-SGD steps: Poisson lots at rate q, Gaussian noise σ.

    Refuses a q the samplers cannot draw (``check_sample_rate``), so that a request for one
    is refused before it is booked."""
    check_sample_rate(sample_rate)
    return SelfComposedEvent(PoissonSampledEvent(sample_rate, GaussianEvent(noise_multiplier)), steps)


# --- JSON form ------------------------------------------------------------------------

def event_to_dict(event: DpEvent) -> dict[str, Any]:
    """A JSON-serialisable dict with a ``type`` key; ``event_from_dict`` inverts it."""
    match event:
        case GaussianEvent(noise_multiplier=s):
            return {"type": "gaussian", "noise_multiplier": s}
        case LaplaceEvent(noise_multiplier=b):
            return {"type": "laplace", "noise_multiplier": b}
        case PoissonSampledEvent(sample_rate=q, event=inner):
            return {"type": "poisson_sampled", "sample_rate": q, "event": event_to_dict(inner)}
        case SelfComposedEvent(event=inner, count=n):
            return {"type": "self_composed", "count": n, "event": event_to_dict(inner)}
        case ComposedEvent(events=inner):
            return {"type": "composed", "events": [event_to_dict(e) for e in inner]}
    raise EventError(f"not a privacy event: {event!r}")


def event_from_dict(data: Any) -> DpEvent:
    """Parse the JSON form; raises ``EventError`` naming what is wrong."""
    if not isinstance(data, dict) or "type" not in data:
        raise EventError(f"an event must be an object with a 'type', got {data!r}")
    kind = data["type"]
    try:
        match kind:
            case "gaussian":
                return GaussianEvent(float(data["noise_multiplier"]))
            case "laplace":
                return LaplaceEvent(float(data["noise_multiplier"]))
            case "poisson_sampled":
                return PoissonSampledEvent(float(data["sample_rate"]), event_from_dict(data["event"]))
            case "self_composed":
                return SelfComposedEvent(event_from_dict(data["event"]), data["count"])
            case "composed":
                return ComposedEvent(tuple(event_from_dict(e) for e in data["events"]))
    except (KeyError, TypeError) as err:
        raise EventError(f"malformed {kind!r} event: {data!r}") from err
    raise EventError(f"unknown event type {kind!r}")


# --- dp-accounting form ---------------------------------------------------------------

def to_dp_accounting(event: DpEvent) -> dp_accounting.DpEvent:
    """The equivalent ``dp_accounting.DpEvent``, for its RDP and PLD accountants."""
    match event:
        case GaussianEvent(noise_multiplier=s):
            return dp_accounting.GaussianDpEvent(s)
        case LaplaceEvent(noise_multiplier=b):
            return dp_accounting.LaplaceDpEvent(b)
        case PoissonSampledEvent(sample_rate=q, event=inner):
            return dp_accounting.PoissonSampledDpEvent(q, to_dp_accounting(inner))
        case SelfComposedEvent(event=inner, count=n):
            return dp_accounting.SelfComposedDpEvent(to_dp_accounting(inner), n)
        case ComposedEvent(events=inner):
            return dp_accounting.ComposedDpEvent([to_dp_accounting(e) for e in inner])
    raise EventError(f"not a privacy event: {event!r}")
