"""Conditional randomized rounding (Kairouz, Liu & Steinke 2021, Algorithm 1's rounding step).

Each coordinate x becomes ⌊x + u⌋ for u uniform on [0, 1): ⌊x⌋ + 1 with probability
x − ⌊x⌋, else ⌊x⌋ — unbiased (up to float64's rounding of x + u, below 2^-26 for |x| <
2^26), and off by less than 1.  A row whose rounded norm exceeds the bound is redrawn whole
(only the failing rows are), so every returned row has norm ≤ bound: the bound is the L2
sensitivity of the integer sum, whatever the draws.  With the bound of
``Lattice.sensitivity`` a try fails with probability ≤ β (e^-½ by default), so
``MAX_TRIES`` failures in a row mean a bug (an input not clipped to the lattice's c), not
bad luck.  A redrawn row is conditioned on its norm, so slightly biased (the paper bounds
it, Theorem 1); a row never over the bound is not.

Exact arithmetic in float64: rows and the bound are capped at ``MAX_BOUND`` = 2^26, so every
rounded entry, squared norm and sum over a micro-batch is an integer below 2^53, and the
norm test compares it with ⌊bound²⌋ computed in rational arithmetic.  Randomness: a seeded
``torch.Generator`` of its own (simulations: never the one that draws lots or noise), or
the OS CSPRNG (``generator=None``, deployed nodes).  The draws must be secret from the
server (the analysis takes them as fresh randomness); their exact distribution matters
only for unbiasedness: the norm bound holds whatever they are.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import torch

MAX_TRIES = 1000
"""Redraws of one row before giving up (at β = e^-½, (0.61)^1000 < 10⁻²¹⁴)."""
MAX_BOUND = 2.0**26
"""Largest row norm and bound: float64 then holds every squared norm exactly."""


def conditional_round(rows: torch.Tensor, bound: float, generator: torch.Generator | None) -> torch.Tensor:
    """(B, d) int64: each row of ``rows`` (float64, lattice units) randomly rounded, redrawn
    until its L2 norm is ≤ ``bound``.  ``generator``: a torch generator on ``rows``' device,
    or None for the OS CSPRNG."""
    return rounded_rows(rows, bound, generator).to(torch.int64)


def rounded_rows(rows: torch.Tensor, bound: float, generator: torch.Generator | None) -> torch.Tensor:
    """``conditional_round``'s integers held in float64 (exact; summing up to 2^26 rows of
    them is exact too), without the int64 copy."""
    if rows.dim() != 2 or rows.dtype != torch.float64:
        raise ValueError(f"rows must be a (B, d) float64 tensor, got {tuple(rows.shape)} {rows.dtype}")
    if not (isinstance(bound, (int, float)) and 0 <= bound <= MAX_BOUND):
        raise ValueError(f"bound must be a number in [0, 2^26], got {bound!r}")
    if generator is not None and generator.device.type != rows.device.type:
        raise ValueError(f"the rounding generator is on {generator.device} but the rows are on {rows.device}")
    norms = torch.linalg.vector_norm(rows, dim=1)
    if not bool(torch.isfinite(norms).all()) or (rows.numel() and float(norms.max()) > MAX_BOUND):
        raise ValueError("rows must be finite with norms <= 2^26")
    limit = math.floor(Fraction(bound) ** 2)
    rounded = _round(rows, generator)
    failing = torch.nonzero(_squared_norms(rounded) > limit).squeeze(1)
    for _ in range(MAX_TRIES):
        if failing.numel() == 0:
            return rounded
        redrawn = _round(rows[failing], generator)
        rounded[failing] = redrawn
        failing = failing[_squared_norms(redrawn) > limit]
    raise RuntimeError(f"conditional rounding: {failing.numel()} rows over the bound after {MAX_TRIES} tries (a bug)")


def nearest_rows(rows: torch.Tensor, bound: float) -> torch.Tensor:
    """(B, d) float64 integers: each coordinate of ``rows`` rounded to the nearest integer
    (``Rounding.NEAREST``: no randomness); every row's norm is checked ≤ ``bound`` exactly
    (RuntimeError otherwise: an input not clipped to the lattice's c, a bug)."""
    if rows.dim() != 2 or rows.dtype != torch.float64:
        raise ValueError(f"rows must be a (B, d) float64 tensor, got {tuple(rows.shape)} {rows.dtype}")
    if not (isinstance(bound, (int, float)) and 0 <= bound <= MAX_BOUND):
        raise ValueError(f"bound must be a number in [0, 2^26], got {bound!r}")
    norms = torch.linalg.vector_norm(rows, dim=1)
    if not bool(torch.isfinite(norms).all()) or (rows.numel() and float(norms.max()) > MAX_BOUND):
        raise ValueError("rows must be finite with norms <= 2^26")
    rounded = torch.round(rows)
    if bool((_squared_norms(rounded) > math.floor(Fraction(bound) ** 2)).any()):
        raise RuntimeError("nearest rounding: a row over the bound (its input was not clipped: a bug)")
    return rounded


def _round(rows: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """⌊rows + u⌋, u uniform on [0, 1): from ``generator``, or k/2³² for k uniform 32-bit
    integers from ``os.urandom`` (a Bernoulli(f) then errs by < 2⁻³², at half the bytes
    and a third of the time of 53-bit uniforms: this is most of a secure contribution)."""
    if generator is None:
        bits = np.frombuffer(os.urandom(4 * rows.numel()), dtype=np.uint32)
        uniform = torch.from_numpy(bits.astype(np.float64)).mul_(2.0**-32).view(rows.shape).to(rows.device)
    else:
        uniform = torch.rand(rows.shape, generator=generator, dtype=torch.float64, device=rows.device)
    return uniform.add_(rows).floor_()


def _squared_norms(rounded: torch.Tensor) -> torch.Tensor:
    return torch.einsum("ij,ij->i", rounded, rounded)
