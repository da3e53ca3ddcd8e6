"""Poisson lots (Abadi et al.'s "lots") and their split into physical micro-batches.

The privacy analysis (``PoissonSampledEvent``) assumes each example joins each lot
independently with probability q, so lot sizes vary and a lot may be empty; nothing here
pads, truncates or reshuffles a lot.  Micro-batching changes memory use, never the lot.
Lots come from a seeded ``torch.Generator`` (reproducible) or, in secure mode, from the OS
CSPRNG (``secure_poisson_lot``; secret even from whoever knows every seed).
"""

from __future__ import annotations

import torch

from fedpriv.dpsgd.csprng import secure_uniform


def poisson_lot(num_examples: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices (ascending) of a lot holding each of ``num_examples`` with probability q.

    Drawn on ``generator``'s device from ``generator`` alone: N uniforms per lot.
    """
    draws = torch.rand(num_examples, generator=generator, device=generator.device)
    return torch.nonzero(draws < sample_rate).squeeze(1)


def secure_poisson_lot(num_examples: int, sample_rate: float, device: torch.device | str) -> torch.Tensor:
    """Indices (ascending, on ``device``) of a lot holding each of ``num_examples`` with
    probability q, from the OS CSPRNG: one 53-bit uniform u ∈ (0, 1] per example, in iff
    u ≤ q (probability ⌊q·2⁵³⌋/2⁵³: q up to 2⁻⁵³, exactly 1 at q = 1).  Not reproducible."""
    draws = secure_uniform(num_examples)
    return torch.nonzero(draws <= sample_rate).squeeze(1).to(device)


def micro_batches(lot: torch.Tensor, max_size: int) -> tuple[torch.Tensor, ...]:
    """``lot`` split into consecutive chunks of at most ``max_size`` indices (none if empty)."""
    return torch.split(lot, max_size) if lot.numel() else ()
