"""The Gaussian mechanism of DP-SGD: N(0, σ²C²·I) added to the *sum* of clipped gradients.

Invariants: the step's gradient buffer is first *overwritten* with the noise, then the
clipped sums are added into it unscaled (their sensitivity is C), and only then is the
whole divided by q·N; noise comes only from the dedicated noise generator — never the
global RNG, never the sampling generator — or, in secure mode, from the OS CSPRNG.

Cost: on CPU torch draws normals single-threaded (MT19937), 3–4 ms of CPU time per 800k
parameters on a 2-core machine — about a quarter of a non-private MLP step at batch 256.
The draw goes straight into the step's reused gradient buffer (no allocation).  Measured
slower here, so not used: numpy's ziggurat (PCG64 or SFC64 bits, 8–10 ms), Box–Muller in
torch ops on faster bits (~4 ms: the log/cos/sin passes alone cost more than torch's fused
kernel), drawing the next step's noise in a background thread (it competes with the
intra-op threads), and splitting the draw into two halves from two generators on two
threads: 2.4 ms instead of 4.4 alone, but no faster inside the step (MLP, ``benchmarks.dpsgd
--quick``: 17.6k samples/s against 18.2k; the second thread competes with torch's spinning
intra-op threads).
"""

from __future__ import annotations

import math

import torch

from fedpriv.dpsgd.csprng import secure_uniform

SECURE_DRAWS = 4
"""Secure mode sums this many N(0, std²) draws and divides by √4 = 2 (Opacus' choice)."""


def fill_gaussian_noise_(
    flat: torch.Tensor, std: float, generator: torch.Generator | None, secure_mode: bool
) -> None:
    """In place, overwrite every entry of ``flat`` with an N(0, std²) draw; zeros if std = 0.

    ``secure_mode``: uniforms from ``os.urandom`` (a CSPRNG; not reproducible), turned into
    normals by Box–Muller in float64, ``SECURE_DRAWS`` summed to blunt floating-point attacks
    on the low bits (Mironov 2012; Jin et al. 2022); see ``csprng`` for why not torch's
    generators.
    """
    if std == 0:
        flat.zero_()
    elif secure_mode:
        flat.copy_(secure_normal(flat.numel(), std))
    elif generator is None:
        raise ValueError("a noise_generator is required unless secure_mode=True")
    else:
        flat.normal_(0.0, std, generator=generator)


def secure_normal(size: int, std: float) -> torch.Tensor:
    """``size`` float64 N(0, std²) draws from OS randomness, sum of SECURE_DRAWS over √SECURE_DRAWS."""
    total = torch.zeros(size, dtype=torch.float64)
    for _ in range(SECURE_DRAWS):
        u1, u2 = secure_uniform(size), secure_uniform(size)
        total += torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2 * math.pi * u2)
    return total * (std / math.sqrt(SECURE_DRAWS))

