"""Basic composition of pure-DP events, exactly: the bound every accountant also reports.

An unsampled ``LaplaceEvent(b)`` is pure (1/b)-DP, and pure DP composes by adding ε with
δ = 0. A conversion through RDP or zCDP is looser for a few such events (two releases of
ε = 1/2 read 1.006 through RDP at δ = 1e-5) and tighter for many small ones, so an
accountant reports the smaller of its own ε and this sum wherever every event is pure, as
dp-accounting and Opacus report the best bound they have. The sum is taken in rationals
(1/b of each double b exactly, times its count) and rounded *up* to a double: a split that
spends at most ε in exact arithmetic is never charged a hair more in floating point.
"""

from __future__ import annotations

import math
from fractions import Fraction

from fedpriv.privacy.accountants.base import UnsupportedEventError
from fedpriv.privacy.accountants.steps import flatten
from fedpriv.privacy.events import DpEvent, LaplaceEvent


def pure_epsilon(event: DpEvent) -> Fraction | None:
    """Σ count/b over the event's steps, exactly, if each is an unsampled Laplace with b > 0;
    ``None`` if any is not pure (a Gaussian, a sampled or non-private step, or one the
    closed-form steps do not cover)."""
    try:
        steps = flatten(event)
    except UnsupportedEventError:
        return None
    total = Fraction(0)
    for step, count in steps.items():
        mechanism = step.mechanism
        if not isinstance(mechanism, LaplaceEvent) or step.sample_rate != 1 or mechanism.noise_multiplier == 0:
            return None
        total += count / Fraction(mechanism.noise_multiplier)
    return total


def round_up(value: Fraction) -> float:
    """The smallest double ≥ ``value`` (∞ past the doubles' range)."""
    try:
        nearest = float(value)
    except OverflowError:
        return math.inf
    return nearest if Fraction(nearest) >= value else math.nextafter(nearest, math.inf)
