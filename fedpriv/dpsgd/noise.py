"""The Gaussian mechanism of DP-SGD: N(0, σ²C²) added to the *sum* of clipped gradients.

Invariants: nothing may rescale the clipped sum before the noise is added (the sum's
sensitivity is C); noise comes only from the dedicated noise generator — never the global
RNG, never the sampling generator — or, in secure mode, from a generator seeded by the OS
CSPRNG each step.
"""

from __future__ import annotations

import secrets

import torch

SECURE_DRAWS = 4
"""Secure mode sums this many N(0, std²) draws and divides by √4 = 2 (Opacus' choice)."""


def add_gaussian_noise_(
    sums: list[torch.Tensor], std: float, generator: torch.Generator | None, secure_mode: bool
) -> None:
    """In place, ``sums[k] += N(0, std²·I)``; a no-op when ``std == 0`` (non-private schedule)."""
    if std == 0 or not sums:
        return
    if secure_mode:
        generator = _fresh_secure_generator(sums[0].device)
    elif generator is None:
        raise ValueError("a noise_generator is required unless secure_mode=True")
    draws = SECURE_DRAWS if secure_mode else 1
    scale = std / draws**0.5
    for total in sums:
        for _ in range(draws):
            noise = torch.randn(total.shape, generator=generator, device=total.device, dtype=total.dtype)
            total.add_(noise, alpha=scale)


def _fresh_secure_generator(device: torch.device) -> torch.Generator:
    """A generator seeded from ``secrets`` (OS CSPRNG): unpredictable, not reproducible."""
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(63))
    return gen
