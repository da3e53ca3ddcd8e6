"""Noise calibration: the smallest σ (3 significant digits) meeting a target ε.

The search runs through ``dpsgd_event`` — the constructor training uses — so the
calibrated σ and the trained mechanism cannot drift apart. ε(σ) is non-increasing in σ;
we bracket the threshold σ* by doubling/halving, then search the 3-significant-digit grid
inside the bracket (``_smallest_on_grid``: the grid point where log ε, interpolated in
log σ, meets the target, then the point below it — about half the RDP curves a plain
bisection computed, each ~0.1 s of CPU), and return the smallest grid value v with
ε(v) ≤ target, after checking it (stepping v up by one unit in the last digit otherwise).
So the returned σ never overshoots the target, and the grid value below v would.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

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
) -> float:
    """Smallest σ, rounded up to 3 significant digits, with
    ε(dpsgd_event(σ, sample_rate, steps), delta) <= target_epsilon under ``accountant``;
    with ``prior_events`` (e.g. a released count), ε of those composed with the training."""
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

    def ok(sigma: float) -> bool:
        event = dpsgd_event(sigma, sample_rate, steps)
        return _epsilon(ComposedEvent((*prior, event)) if prior else event, delta, kind) <= target_epsilon

    lo, hi = 0.5, 1.0
    while not ok(hi):
        lo, hi = hi, 2 * hi
        if hi > _SIGMA_MAX:
            raise ValueError(f"no noise multiplier <= {_SIGMA_MAX:g} reaches epsilon {target_epsilon}")
    while ok(lo):
        lo, hi = lo / 2, lo
        if lo < _SIGMA_MIN:
            return round_up_3(hi)
    def epsilon(sigma: float) -> float:
        event = dpsgd_event(sigma, sample_rate, steps)
        return _epsilon(ComposedEvent((*prior, event)) if prior else event, delta, kind)

    sigma = _smallest_on_grid(ok, epsilon, target_epsilon, lo, hi)
    while not ok(sigma):
        sigma = round_up_3(sigma + unit_3(sigma))
    return sigma


def _below_3(x: float) -> float:
    """The largest 3-significant-digit number < x (x itself one)."""
    return round_up_3(x - unit_3(x * (1 - 1e-9)))


def _smallest_on_grid(ok: Callable[[float], bool], epsilon: Callable[[float], float], target: float,
                      lo: float, hi: float) -> float:
    """The smallest 3-significant-digit σ in (lo, hi] with ``ok(σ)``, given ``ok(lo)`` False and
    ``ok(hi)`` True (``ok`` monotone). Each probe is a grid value between the two ends: where
    log ε is about linear in log σ, the grid point ε(σ) = target predicts, then the one below
    it (two probes settle it when the prediction is right); every third probe halves the
    ends instead, so it ends in O(log) probes whatever ε looks like."""
    top = round_up_3(hi)
    probes = 0
    while (below := _below_3(top)) > lo:
        first_above = round_up_3(lo) if round_up_3(lo) > lo else round_up_3(lo + unit_3(lo))
        if probes % 3 == 2:
            guess = round_up_3(math.sqrt(lo * top))
        elif probes % 3 == 1:
            guess = below
        else:
            e_lo, e_top = epsilon(lo), epsilon(top)
            t = math.log(e_lo / target) / math.log(e_lo / e_top) if e_lo > e_top else 0.5
            guess = round_up_3(math.exp(math.log(lo) + min(max(t, 0.0), 1.0) * math.log(top / lo)))
        guess = min(max(guess, first_above), below)
        if ok(guess):
            top = guess
        else:
            lo = guess
        probes += 1
    return top
