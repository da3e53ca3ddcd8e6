"""Bisection for a monotone yes/no question, shared by δ(ε) inversion and calibration."""

from __future__ import annotations

from collections.abc import Callable


def bisect(
    ok: Callable[[float], bool], lo: float, hi: float, done: Callable[[float, float], bool]
) -> tuple[float, float]:
    """Shrink [lo, hi] with ``ok(lo)`` False and ``ok(hi)`` True (``ok`` monotone: False
    below a threshold, True above) until ``done(lo, hi)``; the invariant is kept."""
    while not done(lo, hi):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return lo, hi
