"""The one Laplace mechanism every Laplace release in fedpriv goes through.

Textbook ``value + b·log(u)`` on doubles leaks the input through the low bits of the
output (Mironov 2012). Here the values are clamped to the bounds the caller states,
rounded to the lattice 2^k·ℤ, and given *discrete* Laplace noise on that lattice (Canonne,
Kamath & Steinke 2020), so every output is a lattice point whatever the input: the output
sets of neighbouring inputs are the same set, only the probabilities differ.

- Secure (the default): OpenDP's ``make_laplace`` does all of it, with noise from the OS
  CSPRNG and a proof (docs/classic.md says why OpenDP and not a sampler of ours).
- Seeded (simulations only: reproducible, so not private against whoever knows the seed):
  the same lattice and the same discrete Laplace, drawn as a difference of two geometric
  variables from a numpy generator.

Either way the privacy cost comes from OpenDP's own privacy map of the measurement — the
rounding to the lattice adds up to ``size · 2^k`` to the L1 sensitivity — and is returned
as a ``LaplaceEvent`` for the ledger: never an ε computed here. A caller that has an ε to
spend asks ``laplace_scale`` for the scale that spends at most it, the rounding included
(not added on top), and ``split_epsilon`` shares one ε between releases whose exact sum is
at most it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from fedpriv.privacy.events import LaplaceEvent

LATTICE_EXPONENT = -30
"""k: outputs are multiples of 2^-30 (about 1e-9), far below any noise scale in use."""


@dataclass(frozen=True)
class LaplaceRelease:
    """Noisy values and what releasing them cost."""

    values: np.ndarray
    event: LaplaceEvent


def _check(sensitivity: float, scale: float, bounds: tuple[float, float], k: int) -> None:
    for name, number in (("sensitivity", sensitivity), ("scale", scale)):
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"{name} must be finite and > 0, got {number!r}")
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(f"bounds must be finite with low <= high, got {bounds!r}")
    step = output_step(bounds, k)
    if scale < step:
        raise ValueError(f"scale {scale!r} is below the outputs' precision {step!r} within bounds {bounds!r}: "
                         "the noise would round away (narrow the bounds or raise the scale)")


def output_step(bounds: tuple[float, float], k: int = LATTICE_EXPONENT) -> float:
    """The coarsest spacing of outputs within ``bounds``: the 2^k lattice or the spacing of
    doubles at the larger |bound|, whichever is wider.

    A noise scale below it rounds away (Haney et al. 2022, "precision-based attacks"): at
    |x| ≥ 2⁵³·scale the output is x itself. ``laplace_event`` refuses such a scale, judged
    on the stated bounds, never on the values: a refusal that depended on the data would
    itself be an unbooked release."""
    low, high = bounds
    return max(math.ldexp(1.0, k), math.ulp(max(abs(low), abs(high))))


@functools.lru_cache(maxsize=64)
def _measurement(size: int, scale: float, k: int):  # noqa: ANN202 (an OpenDP Measurement)
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size), dp.l1_distance(T=float)
    return dp.m.make_laplace(*space, scale=scale, k=k)


def epsilon_of(size: int, sensitivity: float, scale: float, k: int = LATTICE_EXPONENT) -> float:
    """Pure ε of releasing ``size`` values of L1 sensitivity ``sensitivity`` at ``scale``,
    by OpenDP's privacy map (lattice rounding included)."""
    return float(_measurement(size, float(scale), k).map(float(sensitivity)))


def laplace_event(size: int, *, sensitivity: float, scale: float, bounds: tuple[float, float],
                  k: int = LATTICE_EXPONENT) -> LaplaceEvent:
    """What ``laplace_mechanism`` costs on ``size`` values, known before any data is read;
    a ``ValueError`` for parameters it would refuse (a scale below ``output_step``)."""
    _check(sensitivity, scale, bounds, k)
    epsilon = epsilon_of(size, sensitivity, scale, k)
    multiplier = 1.0 / epsilon
    if Fraction(1) / Fraction(multiplier) < Fraction(epsilon):  # 1/b rounded: book no less than the map
        multiplier = math.nextafter(multiplier, 0.0)
    return LaplaceEvent(multiplier)


def laplace_scale(size: int, *, sensitivity: float, epsilon: float, bounds: tuple[float, float],
                  k: int = LATTICE_EXPONENT) -> float:
    """The smallest scale (a double) at which ``laplace_event`` books at most ``epsilon``
    (its 1/b, exactly): the lattice's rounding, size·2^k on the sensitivity, is inside the
    request. A ``ValueError`` where that scale is one ``laplace_event`` refuses."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    scale = (sensitivity + size * math.ldexp(1.0, k)) / epsilon
    while Fraction(1) / Fraction(laplace_event(size, sensitivity=sensitivity, scale=scale, bounds=bounds,
                                               k=k).noise_multiplier) > Fraction(epsilon):
        scale = math.nextafter(scale, math.inf)
    return scale


def split_epsilon(epsilon: float, weights: Sequence[float]) -> tuple[float, ...]:
    """ε shared in proportion to ``weights`` (> 0), each share a double and their exact sum
    at most ε (equal weights keep equal shares): releases at these shares, each spending at
    most its own (``laplace_scale``), spend at most ε together."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"weights must be finite and > 0, got {weights!r}")
    total = math.fsum(weights)
    shares = [epsilon * (w / total) for w in weights]
    while sum(map(Fraction, shares)) > Fraction(epsilon):
        shares = [math.nextafter(x, 0.0) for x in shares]
    return tuple(shares)


def laplace_mechanism(values: np.typing.ArrayLike, *, sensitivity: float, scale: float,
                      bounds: tuple[float, float], rng: np.random.Generator | None = None,
                      k: int = LATTICE_EXPONENT) -> LaplaceRelease:
    """Clamp ``values`` to ``bounds``, add discrete Laplace noise of ``scale`` on the 2^k
    lattice, and return them with their event. ``sensitivity``: the L1 sensitivity of the
    whole (clamped) array. ``rng``: seeded noise for simulations; ``None`` is the OS CSPRNG.
    Parameters are checked (``laplace_event``) before any noise is drawn."""
    array = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError("values to release must be finite (NaN or ∞ found)")
    event = laplace_event(array.size, sensitivity=sensitivity, scale=scale, bounds=bounds, k=k)
    clamped = np.clip(array, *bounds).ravel()
    if rng is None:
        noisy = np.asarray(_measurement(clamped.size, float(scale), k)(clamped.tolist()), dtype=np.float64)
    else:
        noisy = _seeded_discrete_laplace(clamped, scale, k, rng)
    return LaplaceRelease(noisy.reshape(array.shape), event)


def _seeded_discrete_laplace(values: np.ndarray, scale: float, k: int, rng: np.random.Generator) -> np.ndarray:
    """``values`` rounded to 2^k·ℤ plus discrete Laplace noise of ``scale`` (in value units):
    the difference of two geometric variables with success 1 − exp(−2^k / scale)."""
    grain = math.ldexp(1.0, k)
    success = -math.expm1(-grain / scale)
    steps = rng.geometric(success, size=values.size) - rng.geometric(success, size=values.size)
    return (np.round(values / grain) + steps) * grain
