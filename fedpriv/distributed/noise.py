"""The discrete Gaussian N_Z(0, σ²): P(x) ∝ exp(−x²/(2σ²)) on the integers (not a rounded
Gaussian, whose sums and privacy analysis differ).  σ is the pmf's parameter; the
variance is slightly below σ² for σ ≲ 1 and equal to it within 10⁻¹⁰⁰ from σ ≈ 5 on.

Two samplers, one distribution:
- ``generator=None`` (deployed nodes): OpenDP's exact sampler (``make_gaussian`` on an i64
  vector domain), drawing from the OS CSPRNG, with exact arithmetic.  OpenDP's Python
  ``int`` is i32 and its sampler *saturates* there (±2³¹ − 1 come out, silently), so i64
  is named explicitly, and σ is capped at ``MAX_STDDEV``, 2²³ standard deviations below
  i64's range.
- a seeded ``numpy.random.Generator`` (simulations): Canonne, Kamath & Steinke 2020,
  Algorithm 3, vectorised: a discrete Laplace proposal (t = ⌊σ⌋ + 1, the difference of two
  geometrics) accepted with probability exp(−(|y| − σ²/t)²/(2σ²)); rejected entries are
  redrawn.  In floating point, reproducible from the seed: for simulations only.
"""

from __future__ import annotations

import functools
import math

import numpy as np

MAX_STDDEV = 2.0**40
"""σ above this is refused: OpenDP's i64 (and float64's exact integers for the seeded
sampler) hold every draw with overwhelming margin below it."""


def discrete_gaussian(stddev: float, size: int, generator: np.random.Generator | None) -> np.ndarray:
    """``size`` iid draws (int64) of N_Z(0, stddev²); zeros when stddev = 0.  ``generator``:
    seeded numpy generator (simulations), or None for OpenDP's sampler on the OS CSPRNG."""
    if not isinstance(stddev, (int, float)) or isinstance(stddev, bool) or not 0 <= stddev <= MAX_STDDEV:
        raise ValueError(f"the discrete Gaussian's stddev must be a number in [0, 2^40], got {stddev!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"size must be an integer >= 0, got {size!r}")
    if stddev == 0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    if generator is None:
        return np.asarray(_opendp_sampler(float(stddev))([0] * size), dtype=np.int64)
    return _seeded(float(stddev), size, generator)


@functools.lru_cache(maxsize=8)
def _opendp_sampler(stddev: float):  # noqa: ANN202 (an OpenDP Measurement)
    """OpenDP's discrete Gaussian measurement on i64 vectors (any length), built once per σ."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64"), scale=stddev)


def _seeded(stddev: float, size: int, generator: np.random.Generator) -> np.ndarray:
    """Canonne, Kamath & Steinke 2020, Algorithm 3, redrawing only the rejected entries."""
    t = math.floor(stddev) + 1
    success = -math.expm1(-1 / t)  # geometric G1 − G2 with P(G = k) ∝ e^(−k/t): discrete Laplace of scale t
    variance = stddev * stddev
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        n = pending.size
        proposal = generator.geometric(success, n) - generator.geometric(success, n)
        accept = generator.random(n) < np.exp(-np.square(np.abs(proposal) - variance / t) / (2 * variance))
        out[pending[accept]] = proposal[accept]
        pending = pending[~accept]
    return out
