"""Noise calibration: the smallest σ (3 significant digits) meeting a target ε.

The search runs through ``dpsgd_event`` — the constructor training uses — so the
calibrated σ and the trained mechanism cannot drift apart. ε(σ) is non-increasing in σ;
we bracket the threshold σ* by doubling/halving, bisect until the bracket's ends round
up to the same 3-significant-digit value, and return that value v ≥ σ*, after checking
ε(v) ≤ target (stepping v up by one unit in the last digit otherwise). So the returned σ
never overshoots the target, and v minus one unit in the last digit would.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from fedpriv.privacy._search import bisect
from fedpriv.privacy.accountants import AccountantKind, epsilon_of
from fedpriv.privacy.accountants.base import check_delta
from fedpriv.privacy.events import ComposedEvent, DpEvent, dpsgd_event

_SIGMA_MIN, _SIGMA_MAX = 1e-3, 1e6


def round_up_3(x: float) -> float:
    """Smallest 3-significant-digit number >= x (up to float representation)."""
    exponent = math.floor(math.log10(x)) - 2
    unit = 10.0**exponent
    return round(math.ceil(x / unit - 1e-9) * unit, -exponent)


def unit_3(x: float) -> float:
    """One unit in the 3rd significant digit of x."""
    return 10.0 ** (math.floor(math.log10(x)) - 2)


@functools.lru_cache(maxsize=1024)
def _epsilon(event: DpEvent, delta: float, kind: AccountantKind) -> float:
    """``epsilon_of``, memoised: calibrations at one (q, steps, δ) for several targets (a
    figure's curve) ask for the same σ's — the bracket's powers of 2, its first midpoints."""
    return epsilon_of(event, delta, kind)


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: AccountantKind | str = AccountantKind.RDP,
    prior_events: Sequence[DpEvent] = (),
    event: Callable[[float], DpEvent] | None = None,
) -> float:
    """Smallest σ, rounded up to 3 significant digits, with
    ε(dpsgd_event(σ, sample_rate, steps), delta) <= target_epsilon under ``accountant``;
    with ``prior_events`` (e.g. a released count), ε of those composed with the training.
    ``event`` (σ → the whole training's event, non-increasing ε in σ) replaces
    ``dpsgd_event(σ, sample_rate, steps)`` for another mechanism (distributed DP-SGD)."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    check_delta(delta)
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    kind = AccountantKind(accountant)

    prior = tuple(prior_events)
    if prior and epsilon_of(ComposedEvent(prior), delta, kind) >= target_epsilon:
        raise ValueError(f"the prior events alone spend epsilon >= {target_epsilon}: no noise multiplier reaches it")

    training = event or (lambda sigma: dpsgd_event(sigma, sample_rate, steps))

    def ok(sigma: float) -> bool:
        spent = training(sigma)
        return _epsilon(ComposedEvent((*prior, spent)) if prior else spent, delta, kind) <= target_epsilon

    lo, hi = 0.5, 1.0
    while not ok(hi):
        lo, hi = hi, 2 * hi
        if hi > _SIGMA_MAX:
            raise ValueError(f"no noise multiplier <= {_SIGMA_MAX:g} reaches epsilon {target_epsilon}")
    while ok(lo):
        lo, hi = lo / 2, lo
        if lo < _SIGMA_MIN:
            return round_up_3(hi)
    lo, hi = bisect(ok, lo, hi, done=lambda a, b: round_up_3(a) == round_up_3(b) or b - a < 1e-12 * b)
    sigma = round_up_3(hi)
    while not ok(sigma):
        sigma = round_up_3(sigma + unit_3(sigma))
    return sigma
