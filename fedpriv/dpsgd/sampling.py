"""Poisson lots (Abadi et al.'s "lots") and their split into physical micro-batches.

The privacy analysis (``PoissonSampledEvent``) assumes each example joins each lot
independently with probability q, so lot sizes vary and a lot may be empty; nothing here
pads, truncates or reshuffles a lot.  Micro-batching changes memory use, never the lot.
Lots come from a seeded ``torch.Generator`` (reproducible) or, in secure mode, from the OS
CSPRNG (``secure_poisson_lot``; secret even from whoever knows every seed).

Both keep an example iff its uniform 53-bit integer k is below ``inclusion_threshold(q)`` =
⌊q·2⁵³⌋, compared exactly: the rate is ⌊q·2⁵³⌋/2⁵³, at most the q the accountant is given
(a float32 ``torch.rand(n) < q`` would keep each with probability ⌈q·2²⁴⌉/2²⁴ ≥ 2⁻²⁴).
"""

from __future__ import annotations

import math

import torch

from fedpriv.dpsgd.config import check_sample_rate
from fedpriv.dpsgd.csprng import secure_uniform
from fedpriv.privacy.events import SAMPLER_BITS


def inclusion_threshold(sample_rate: float) -> int:
    """⌊q·2⁵³⌋ (exact: scaling by 2⁵³ does not round) for a q the samplers accept."""
    return math.floor(math.ldexp(check_sample_rate(sample_rate), SAMPLER_BITS))


def poisson_lot(num_examples: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices (ascending) of a lot holding each of ``num_examples`` with probability
    ⌊q·2⁵³⌋/2⁵³ ≤ q.

    Drawn on ``generator``'s device (CPU or CUDA) from ``generator`` alone: N 53-bit integers
    per lot (``torch.randint`` over 2⁵³ values reduces 64 random bits mod 2⁵³ on both: exactly
    uniform).
    """
    threshold = inclusion_threshold(sample_rate)
    draws = torch.randint(0, 2**SAMPLER_BITS, (num_examples,), generator=generator, device=generator.device,
                          dtype=torch.int64)
    return torch.nonzero(draws < threshold).squeeze(1)


def secure_poisson_lot(num_examples: int, sample_rate: float, device: torch.device | str) -> torch.Tensor:
    """Indices (ascending, on ``device``) of a lot holding each of ``num_examples`` with
    probability ⌊q·2⁵³⌋/2⁵³ (exactly 1 at q = 1), from the OS CSPRNG.  Not reproducible."""
    threshold = inclusion_threshold(sample_rate)
    draws = secure_uniform(num_examples) * 2.0**SAMPLER_BITS  # k + 1 for k uniform in [0, 2⁵³), exactly
    return torch.nonzero(draws <= threshold).squeeze(1).to(device)


def micro_batches(lot: torch.Tensor, max_size: int) -> tuple[torch.Tensor, ...]:
    """``lot`` split into consecutive chunks of at most ``max_size`` indices (none if empty)."""
    return torch.split(lot, max_size) if lot.numel() else ()
