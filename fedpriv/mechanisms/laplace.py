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
as a ``LaplaceEvent`` for the ledger: never an ε computed here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

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
    return LaplaceEvent(1.0 / epsilon_of(size, sensitivity, scale, k))


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
