"""The discrete Gaussian mechanism for a node's central integer releases (its evaluation).

Textbook ``value + σ·randn()`` on doubles leaks the input through the low bits of the
output (Mironov 2012): for a released value of 0 the output is the noise itself, a double
whose bits ``1 + noise`` can never produce. Here every coordinate is an integer (a count,
or a bounded quantity snapped per record to a lattice and counted in lattice steps), and
its noise is the discrete Gaussian N_Z(0, (s·u_j)²) on the integers, where u_j is the most
one record moves coordinate j. Every output is an integer whatever the input: neighbouring
inputs have the same set of outputs, only the probabilities differ.

Noise: OpenDP's exact sampler on the OS CSPRNG (``generator=None``), or the seeded
sampler of ``fedpriv.distributed.noise`` (simulations): the one discrete Gaussian of fedpriv.

Cost (Canonne, Kamath & Steinke 2020, Theorem 14): independent N_Z(0, σ_j²) on an integer
query with Σ_j (Δ_j/σ_j)² ≤ S² is (S²/2)-zCDP, RDP α·S²/2: the Gaussian's. With σ_j = s·u_j
and Δ_j ≤ u_j for each of d coordinates, S = √d/s: the event is the single-share
``DistributedDiscreteGaussianEvent(s, 1, √d, d)`` (in units of u_j per coordinate), whose
accountants (rdp, zcdp) give exactly that curve (``fedpriv.privacy.accountants.distributed``,
n = 1). dp-accounting has no discrete Gaussian, so the PLD and (ε, δ) accountants refuse it
rather than price it as a continuous Gaussian it is not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedpriv.distributed.noise import MAX_STDDEV, discrete_gaussian
from fedpriv.privacy.events import DistributedDiscreteGaussianEvent


def discrete_gaussian_event(noise_stddev: float, units: Sequence[int]) -> DistributedDiscreteGaussianEvent:
    """What ``discrete_gaussian_mechanism`` costs on coordinates whose per-record change is
    at most ``units`` (each its own lattice step count); a ``ValueError`` for a noise the
    samplers cannot draw (s·u_j above ``MAX_STDDEV``), before anything is read or booked."""
    _check(noise_stddev, units)
    return DistributedDiscreteGaussianEvent(float(noise_stddev), 1, math.sqrt(len(units)), len(units))


def discrete_gaussian_mechanism(values: Sequence[int], *, noise_stddev: float, units: Sequence[int],
                                generator: np.random.Generator | None) -> np.ndarray:
    """``values[j]`` + N_Z(0, (s·units[j])²), as int64; ``generator``: seeded (simulations)
    or ``None`` for OpenDP's sampler on the OS CSPRNG. The caller guarantees that one record
    moves coordinate j by at most ``units[j]`` (the event's premise)."""
    _check(noise_stddev, units)
    exact = np.asarray(values, dtype=np.int64)
    if exact.shape != (len(units),):
        raise ValueError(f"need {len(units)} integer values, got shape {exact.shape}")
    noise = [discrete_gaussian(noise_stddev * unit, 1, generator)[0] for unit in units]
    return exact + np.asarray(noise, dtype=np.int64)


def _check(noise_stddev: float, units: Sequence[int]) -> None:
    if not (isinstance(noise_stddev, (int, float)) and math.isfinite(noise_stddev) and noise_stddev > 0):
        raise ValueError(f"the noise's stddev must be finite and > 0, got {noise_stddev!r}")
    if not units or not all(isinstance(u, int) and not isinstance(u, bool) and u >= 1 for u in units):
        raise ValueError(f"units must be integers >= 1, got {units!r}")
    if noise_stddev * max(units) > MAX_STDDEV:
        raise ValueError(f"noise {noise_stddev:g} × {max(units)} lattice steps exceeds the samplers' 2^40")
