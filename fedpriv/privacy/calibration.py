"""Noise calibration: the smallest σ (3 significant digits) meeting a target ε, and the same
for the distributed discrete Gaussian's share scale s.

The search runs through ``dpsgd_event`` (``distributed_dpsgd_event`` for s, starting at
the s of σ = √n·s/Δ₂ = 1) — the constructor training uses — so the
calibrated σ and the trained mechanism cannot drift apart. ε(σ) is non-increasing in σ;
we bracket the threshold σ* by doubling/halving, narrow the bracket (``_refine``: secant
steps on log ε against log σ, snapped to the 3-digit grid) until its ends round up to the
same 3-significant-digit value, and return that value v ≥ σ*, after checking
ε(v) ≤ target (stepping v up by one unit in the last digit otherwise). So the returned σ
never overshoots the target, and v minus one unit in the last digit would.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from fedpriv.privacy.accountants import AccountantKind, epsilon_of
from fedpriv.privacy.accountants.base import check_delta
from fedpriv.privacy.events import (
    MIN_SHARE_STDDEV,
    ComposedEvent,
    DistributedDiscreteGaussianEvent,
    DpEvent,
    distributed_dpsgd_event,
    dpsgd_event,
)

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


def _check_request(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> None:
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    check_delta(delta)
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")


def _smallest_noise(training: Callable[[float], DpEvent], target_epsilon: float, delta: float,
                    accountant: AccountantKind | str, prior_events: Sequence[DpEvent], unit: float = 1.0,
                    floor: float = 0.0, name: str = "noise multiplier") -> float:
    """Smallest v (3 significant digits, >= ``floor``) with ε(prior + training(v)) <= target;
    the search brackets from ``unit`` (σ = 1) within [1e-3, 1e6]·``unit`` (module docstring)."""
    kind = AccountantKind(accountant)
    prior = tuple(prior_events)
    if prior and epsilon_of(ComposedEvent(prior), delta, kind) >= target_epsilon:
        raise ValueError(f"the prior events alone spend epsilon >= {target_epsilon}: no {name} reaches it")

    def gap(value: float) -> float:
        """log ε(value) − log target: ≤ 0 where ``value`` meets the target."""
        if value < floor:
            return math.inf
        event = training(value)
        epsilon = _epsilon(ComposedEvent((*prior, event)) if prior else event, delta, kind)
        return math.log(epsilon / target_epsilon) if epsilon > 0 else -math.inf

    def ok(value: float) -> bool:
        return gap(value) <= 0

    lo, hi = 0.5 * unit, unit
    g_hi = gap(hi)
    g_lo = gap(lo) if g_hi <= 0 else math.inf  # unevaluated (an RDP curve saved) when doubling replaces lo
    while g_hi > 0:
        lo, hi, g_lo = hi, 2 * hi, g_hi
        if hi > _SIGMA_MAX * unit:
            raise ValueError(f"no {name} <= {_SIGMA_MAX * unit:g} reaches epsilon {target_epsilon}")
        g_hi = gap(hi)
    while g_lo <= 0:
        lo, hi, g_hi = lo / 2, lo, g_lo
        if lo < _SIGMA_MIN * unit:
            return round_up_3(hi)
        g_lo = gap(lo)
    lo, hi = _refine(gap, lo, hi, g_lo, g_hi)
    value = round_up_3(hi)
    while not ok(value):
        value = round_up_3(value + unit_3(value))
    return value


def _below(value: float) -> float:
    """The largest 3-significant-digit number below the 3-digit ``value`` (0.999 below 1.00)."""
    unit = unit_3(value)
    lower = value - unit
    return lower if unit_3(lower) == unit else value - unit / 10


def _refine(gap: Callable[[float], float], lo: float, hi: float, g_lo: float, g_hi: float) -> tuple[float, float]:
    """Shrink [lo, hi] (gap(lo) > 0 ≥ gap(hi)) until lo is at or above the 3-digit value just
    below round_up_3(hi) (which then fails). Each step evaluates the 3-digit grid point at or
    below the root of the log-log secant (ε(σ) is smooth, monotone, near a power law),
    halving the stale end's gap when one end moves twice (Illinois), else the midpoint:
    about half bisection's evaluations."""
    moved = 0  # +1: hi moved last, -1: lo moved last
    while lo < _below(round_up_3(hi)) * (1 - 1e-12) and hi - lo >= 1e-12 * hi:
        value = 0.5 * (lo + hi)
        if math.isfinite(g_lo) and math.isfinite(g_hi) and g_lo > g_hi:
            root = math.exp(math.log(lo) + g_lo / (g_lo - g_hi) * math.log(hi / lo))
            grid = round_up_3(root)
            grid = grid if grid < hi else _below(grid)
            value = grid if lo < grid < hi else value
        g = gap(value)
        if g <= 0:
            hi, g_hi = value, g
            g_lo = g_lo / 2 if moved == 1 else g_lo
            moved = 1
        else:
            lo, g_lo = value, g
            g_hi = g_hi / 2 if moved == -1 else g_hi
            moved = -1
    return lo, hi


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
    _check_request(target_epsilon, delta, sample_rate, steps)
    return _smallest_noise(lambda sigma: dpsgd_event(sigma, sample_rate, steps), target_epsilon, delta, accountant,
                           prior_events)


def calibrate_distributed_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    shares: int,
    sensitivity: float,
    dimension: int,
    accountant: AccountantKind | str = AccountantKind.RDP,
    prior_events: Sequence[DpEvent] = (),
) -> float:
    """Smallest share scale s (lattice units), rounded up to 3 significant digits and >= 1/2
    with ``shares`` >= 2, with ε(distributed_dpsgd_event(s, shares, sensitivity, dimension,
    sample_rate, steps), delta) <= target_epsilon under ``accountant`` (rdp: the only one
    with a subsampling bound for it); ``prior_events`` as in ``calibrate_noise_multiplier``."""
    _check_request(target_epsilon, delta, sample_rate, steps)
    DistributedDiscreteGaussianEvent(1.0, shares, sensitivity, dimension)  # refuses bad arguments up front
    return _smallest_noise(
        lambda s: distributed_dpsgd_event(s, shares, sensitivity, dimension, sample_rate, steps),
        target_epsilon, delta, accountant, prior_events, unit=sensitivity / math.sqrt(shares),
        floor=MIN_SHARE_STDDEV if shares > 1 else 0.0, name="noise share")
