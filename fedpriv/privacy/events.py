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
- ``DistributedDiscreteGaussianEvent(s, n, Δ₂, d)``: the sum of n honest shares of
  discrete Gaussian noise N_Z(0, s²)^d added to an integer vector query of L2 sensitivity
  Δ₂ (all in lattice units) — distributed DP over secure aggregation.
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


MIN_SHARE_STDDEV = 0.5
"""Kairouz, Liu & Steinke's Theorem 1 (the sum of n ≥ 2 discrete Gaussians) assumes each
share's scale s ≥ 1/2; a single share (the discrete Gaussian itself) needs only s > 0."""


def _check_finite_positive(name: str, value: float) -> None:
    _check_finite_nonneg(name, value)
    if value == 0:
        raise EventError(f"{name} must be > 0, got {value!r}")


def _check_positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise EventError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class DistributedDiscreteGaussianEvent:
    """Distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML 2021): ``shares`` honest
    nodes each add N_Z(0, s²)^d noise, s = ``noise_stddev`` (the discrete Gaussian's scale
    parameter), to an integer query in Z^d (d = ``dimension``) whose L2 sensitivity is
    ``sensitivity`` = Δ₂, all in lattice units; only the sum is released. The effective
    noise multiplier is √n·s/Δ₂; the sum is not a discrete Gaussian, which costs a little
    (``fedpriv.privacy.accountants.distributed``)."""

    noise_stddev: float
    shares: int
    sensitivity: float
    dimension: int

    def __post_init__(self) -> None:
        _check_positive_int("shares", self.shares)
        _check_positive_int("dimension", self.dimension)
        _check_finite_positive("sensitivity", self.sensitivity)
        _check_finite_positive("noise_stddev", self.noise_stddev)
        if self.shares > 1 and self.noise_stddev < MIN_SHARE_STDDEV:
            raise EventError(f"noise_stddev must be >= {MIN_SHARE_STDDEV} with shares >= 2 (Kairouz et al.'s "
                             f"Theorem 1), got {self.noise_stddev!r}")

    @property
    def noise_multiplier(self) -> float:
        """√n·s/Δ₂: the Gaussian noise multiplier the honest shares add up to."""
        return math.sqrt(self.shares) * self.noise_stddev / self.sensitivity


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


DpEvent = (GaussianEvent | LaplaceEvent | DistributedDiscreteGaussianEvent | PoissonSampledEvent | SelfComposedEvent
           | ComposedEvent)
_EVENT_TYPES = (GaussianEvent, LaplaceEvent, DistributedDiscreteGaussianEvent, PoissonSampledEvent, SelfComposedEvent,
                ComposedEvent)


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


def distributed_dpsgd_event(noise_stddev: float, shares: int, sensitivity: float, dimension: int,
                            sample_rate: float, steps: int) -> DpEvent:
    """The event of ``steps`` distributed DP-SGD steps: Poisson lots at rate q, the sum of
    ``shares`` honest discrete Gaussian shares of scale ``noise_stddev`` on a query of L2
    sensitivity ``sensitivity`` in Z^``dimension`` (lattice units). Refuses a q the samplers
    cannot draw, like ``dpsgd_event``."""
    check_sample_rate(sample_rate)
    mechanism = DistributedDiscreteGaussianEvent(noise_stddev, shares, sensitivity, dimension)
    return SelfComposedEvent(PoissonSampledEvent(sample_rate, mechanism), steps)


# --- JSON form ------------------------------------------------------------------------

def event_to_dict(event: DpEvent) -> dict[str, Any]:
    """A JSON-serialisable dict with a ``type`` key; ``event_from_dict`` inverts it."""
    match event:
        case GaussianEvent(noise_multiplier=s):
            return {"type": "gaussian", "noise_multiplier": s}
        case LaplaceEvent(noise_multiplier=b):
            return {"type": "laplace", "noise_multiplier": b}
        case DistributedDiscreteGaussianEvent(noise_stddev=s, shares=n, sensitivity=c, dimension=d):
            return {"type": "distributed_discrete_gaussian", "noise_stddev": s, "shares": n, "sensitivity": c,
                    "dimension": d}
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
            case "distributed_discrete_gaussian":
                return DistributedDiscreteGaussianEvent(data["noise_stddev"], data["shares"], data["sensitivity"],
                                                        data["dimension"])
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

class NoDpAccountingFormError(EventError):
    """dp-accounting has no event for this mechanism (the distributed discrete Gaussian)."""


def to_dp_accounting(event: DpEvent) -> dp_accounting.DpEvent:
    """The equivalent ``dp_accounting.DpEvent``, for its RDP and PLD accountants; raises
    ``NoDpAccountingFormError`` for an event that contains a distributed discrete Gaussian."""
    match event:
        case DistributedDiscreteGaussianEvent():
            raise NoDpAccountingFormError(f"dp-accounting has no distributed discrete Gaussian event: {event!r} "
                                          "(use fedpriv's rdp or zcdp accountant)")
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
