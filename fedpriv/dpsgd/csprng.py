"""Uniform draws from the OS CSPRNG (``os.urandom``), for ``secure_mode``'s lots and noise.

torch's generators are not used there: a CPU ``torch.Generator`` keeps only 32 bits of its
seed, so a stream seeded from a secret could be recovered by brute force.
"""

from __future__ import annotations

import os

import torch

UNIFORM_BITS = 53
"""Random bits per uniform: a float64 mantissa's worth."""


def secure_uniform(size: int) -> torch.Tensor:
    """``size`` float64 uniforms on (0, 1], each k/2⁵³ for k uniform on 1..2⁵³, from ``os.urandom``."""
    if size == 0:  # torch.frombuffer refuses an empty buffer
        return torch.zeros(0, dtype=torch.float64)
    bits = torch.frombuffer(bytearray(os.urandom(8 * size)), dtype=torch.int64)
    return ((bits & (2**UNIFORM_BITS - 1)) + 1).double() / 2.0**UNIFORM_BITS
