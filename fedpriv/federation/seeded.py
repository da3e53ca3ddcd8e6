"""The warning every process that runs with ``randomness = seeded`` prints, once."""

from __future__ import annotations

import functools
import sys

SEEDED_RISK = (
    "node randomness = seeded: whoever knows the seed can regenerate the DP noise and subtract "
    "it, and the noise comes from floating-point Gaussian samplers (torch.randn), not the OS "
    "CSPRNG; for reproducible simulations only, never a deployment (randomness = secure)"
)


@functools.cache
def warn_seeded() -> None:
    """Print ``SEEDED_RISK`` on stderr, the first time only in this process."""
    print(f"fedpriv warning: {SEEDED_RISK}", file=sys.stderr, flush=True)
