"""The integer lattice a node's clipped gradients are encoded on, and its sensitivity.

A clipped per-example gradient g (‖g‖ ≤ C) becomes g·scale (norm ≤ c = C·scale), rounded to
integers by conditional randomized rounding (``rounding``): each try is redrawn until its
norm is at most Δ₂, so Δ₂ bounds one example's contribution in lattice units, the L2
sensitivity of the integer sum (add/remove one example).  Kairouz, Liu & Steinke 2021
("The distributed discrete Gaussian mechanism for federated learning with secure
aggregation"), Theorem 1, with clip norm c and rejection bound β per try:

    Δ₂² = min((c + √d)², c² + d/4 + √(2 ln(1/β))·(c + √d/2)).

The first term holds for any rounding (each coordinate moves by < 1); the second is the
one conditional rounding enforces, a try failing with probability ≤ β.

``Rounding.NEAREST`` rounds each coordinate to the nearest integer instead: each moves by at
most ½, so by the triangle inequality Δ₂ = c·(1 + 2⁻³⁰) + √d/2 (the 2⁻³⁰ covers float64's
error in clipping). It draws no random number (a secure contribution's rounding is most of
its time: 1.6·10⁸ draws for a lot of 4,096 on ScatterNet+linear) and its bias, below ½ a
lattice unit per coordinate and example, vanishes as the lattice gets finer; it needs a
finer lattice than conditional rounding for the same inflation (√d/2 against d/(8c)).  Δ₂/c → 1 as the
lattice gets finer: ``fine_scale`` picks the coarsest power of two within a requested
inflation.  Integer vectors are summed modulo 2^bits by secure aggregation; the server
centres the sum into [−2^(bits−1), 2^(bits−1)), right as long as no coordinate of the true
sum leaves that range (``check_headroom``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

MAX_MODULUS_BITS = 62
"""Modular sums and their centred values stay exact in int64 (and in uint64 vectors)."""
NOISE_TAIL = 12
"""``check_headroom``'s bound on a noise coordinate, in standard deviations: P(|x| ≥ 12σ) < 10⁻³¹."""


class Rounding(StrEnum):
    """How a clipped example becomes an integer vector (module docstring)."""

    CONDITIONAL = "conditional"
    NEAREST = "nearest"


CLIP_SLACK = 2.0**-30
"""Relative slack of the nearest-rounding bound for float64's error in a clipped norm."""


@dataclass(frozen=True)
class Lattice:
    """Scale, clip norm and dimension of the encoding, all public.

    ``scale``: lattice points per gradient unit (a gradient of norm C has norm C·scale);
    ``max_grad_norm``: C; ``dimension``: d, the number of model parameters; ``beta``:
    conditional rounding's per-try rejection bound; ``modulus_bits``: secure aggregation's
    modulus 2^bits.
    """

    scale: float
    max_grad_norm: float
    dimension: int
    beta: float = math.exp(-0.5)
    modulus_bits: int = 32
    rounding: Rounding = Rounding.CONDITIONAL

    def __post_init__(self) -> None:
        object.__setattr__(self, "rounding", Rounding(self.rounding))
        for name in ("scale", "max_grad_norm"):
            value = getattr(self, name)
            if not _real(value) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if not _integer(self.dimension) or self.dimension < 1:
            raise ValueError(f"dimension must be an integer >= 1, got {self.dimension!r}")
        if not _real(self.beta) or not 0 < self.beta < 1:
            raise ValueError(f"beta must be in (0, 1), got {self.beta!r}")
        if not _integer(self.modulus_bits) or not 2 <= self.modulus_bits <= MAX_MODULUS_BITS:
            raise ValueError(f"modulus_bits must be an integer in [2, {MAX_MODULUS_BITS}], got {self.modulus_bits!r}")

    @property
    def clip(self) -> float:
        """c = C·scale: the clip norm in lattice units."""
        return self.max_grad_norm * self.scale

    @property
    def sensitivity(self) -> float:
        """Δ₂ in lattice units (Kairouz, Liu & Steinke 2021, Theorem 1; nearest rounding's
        triangle inequality: module docstring)."""
        if self.rounding is Rounding.NEAREST:
            return self.clip * (1 + CLIP_SLACK) + math.sqrt(self.dimension) / 2
        return sensitivity(self.clip, self.dimension, self.beta)

    @property
    def modulus(self) -> int:
        """2^bits."""
        return 1 << self.modulus_bits

    def noise_stddev(self, noise_multiplier: float, honest_shares: int) -> float:
        """One node's share s = σ·C·scale/√n of the noise, in lattice units: n honest shares
        sum to variance n·s² = (σ·C·scale)², the centralized DP-SGD noise on this lattice."""
        if not _real(noise_multiplier) or not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
            raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier!r}")
        if not _integer(honest_shares) or honest_shares < 1:
            raise ValueError(f"honest_shares must be an integer >= 1, got {honest_shares!r}")
        return noise_multiplier * self.clip / math.sqrt(honest_shares)


def sensitivity(clip: float, dimension: int, beta: float) -> float:
    """Δ₂ = √min((c + √d)², c² + d/4 + √(2 ln(1/β))·(c + √d/2)) for clip norm c (lattice units)."""
    root_d, tail = math.sqrt(dimension), math.sqrt(2 * math.log(1 / beta))
    conditional = clip * clip + dimension / 4 + tail * (clip + root_d / 2)
    return math.sqrt(min((clip + root_d) * (clip + root_d), conditional))


def sensitivity_ratio(inverse_clip: float, dimension: int, beta: float) -> float:
    """Δ₂/c, the sensitivity's inflation by rounding, from 1/c (``fine_scale``'s search
    spans c up to 2^1000, where ``sensitivity`` would overflow)."""
    root_d, tail = math.sqrt(dimension), math.sqrt(2 * math.log(1 / beta))
    square = inverse_clip * inverse_clip  # inf, not OverflowError, for a tiny c
    any_rounding = (1 + root_d * inverse_clip) * (1 + root_d * inverse_clip)
    conditional = 1 + dimension / 4 * square + tail * (inverse_clip + root_d / 2 * square)
    return math.sqrt(min(any_rounding, conditional))


def fine_scale(
    max_grad_norm: float, dimension: int, inflation: float = 1.001, beta: float = math.exp(-0.5),
    rounding: Rounding = Rounding.CONDITIONAL,
) -> float:
    """The smallest power-of-two scale whose Δ₂/(C·scale) ≤ ``inflation``: quantization
    then adds at most that factor to the sensitivity (Δ₂/c decreases as the scale grows)."""
    if not _real(inflation) or not (math.isfinite(inflation) and inflation > 1):
        raise ValueError(f"inflation must be finite and > 1, got {inflation!r}")
    Lattice(1.0, max_grad_norm, dimension, beta)  # validates the rest
    if not 2.0**-400 <= max_grad_norm <= 2.0**400:
        raise ValueError(f"max_grad_norm must be in [2^-400, 2^400] to pick a scale, got {max_grad_norm!r}")

    def fine_enough(exponent: int) -> bool:
        inverse_clip = math.ldexp(1 / max_grad_norm, -exponent)
        if Rounding(rounding) is Rounding.NEAREST:
            return 1 + CLIP_SLACK + math.sqrt(dimension) / 2 * inverse_clip <= inflation
        return sensitivity_ratio(inverse_clip, dimension, beta) <= inflation

    low, high = -600, 600  # 2^-600 is never fine enough (c < 2^-200), 2^600 is unless the bound is ~1 + 2^-200
    if not fine_enough(high):
        raise ValueError(f"no power-of-two scale reaches inflation {inflation} for C={max_grad_norm}, d={dimension}")
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fine_enough(middle) else (middle, high)
    return math.ldexp(1.0, high)


def check_headroom(lattice: Lattice, max_lot: int, total_noise_stddev: float) -> None:
    """Refuse (ValueError) a lattice whose modular sum could wrap: a sum of ``max_lot``
    examples (each of norm ≤ Δ₂, so each coordinate ≤ Δ₂) plus noise of total standard
    deviation ``total_noise_stddev`` must stay within ±2^(bits−1) (noise bounded by
    ``NOISE_TAIL`` standard deviations)."""
    if not _integer(max_lot) or max_lot < 0:
        raise ValueError(f"max_lot must be an integer >= 0, got {max_lot!r}")
    if not _real(total_noise_stddev) or not (math.isfinite(total_noise_stddev) and total_noise_stddev >= 0):
        raise ValueError(f"total_noise_stddev must be finite and >= 0, got {total_noise_stddev!r}")
    reach = max_lot * lattice.sensitivity + NOISE_TAIL * total_noise_stddev
    if reach >= lattice.modulus // 2:
        raise ValueError(
            f"the modular sum could wrap: {max_lot} examples × Δ₂ {lattice.sensitivity:.4g} + {NOISE_TAIL}σ "
            f"{NOISE_TAIL * total_noise_stddev:.4g} = {reach:.4g} >= 2^{lattice.modulus_bits - 1}: use a coarser "
            "scale or more modulus bits"
        )


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
