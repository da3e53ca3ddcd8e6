"""Clip factors: how much each example's gradient is scaled so its norm is at most C.

Every gradient path reports, per trainable parameter tensor, the squared per-example norms
(shape ``(B,)``); the factors computed here are then applied *before* summing, so the sum of
clipped gradients has L2 sensitivity ≤ C (add/remove one example).  Sums are added into
caller-owned buffers (``ClippedSumFn``), so a step allocates no parameter-sized tensors.  Factor
``C / max(‖g‖, C)`` is exactly 1 for small gradients and never needs an epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from fedpriv.dpsgd.config import Clipping

ClippedSumFn = Callable[[torch.Tensor, torch.Tensor, Sequence[torch.Tensor]], torch.Tensor]
"""``clipped_sum(features, labels, into)``: add Σ_i clipped g_i of the micro-batch into
``into`` (one buffer per trainable parameter tensor, in place); return Σ_i loss_i."""


def clip_factors(
    sq_norms: Sequence[torch.Tensor], max_grad_norm: float, clipping: Clipping
) -> list[torch.Tensor]:
    """Per parameter tensor, the ``(B,)`` factors for ``sq_norms[k][i] = ‖g_{i,k}‖²``.

    ``FLAT``: one factor per example from its total norm, bound C.  ``PER_LAYER``: one factor
    per (example, tensor), bound C/√K for K tensors.  ``max_grad_norm = inf``: all ones.
    """
    if math.isinf(max_grad_norm):
        return [torch.ones_like(n) for n in sq_norms]
    if clipping is Clipping.FLAT:
        total = torch.stack(list(sq_norms)).sum(0).sqrt()
        factor = max_grad_norm / total.clamp(min=max_grad_norm)
        return [factor] * len(sq_norms)
    bound = per_layer_bound(max_grad_norm, len(sq_norms))
    return [bound / n.sqrt().clamp(min=bound) for n in sq_norms]


def per_layer_bound(max_grad_norm: float, num_tensors: int) -> float:
    """C/√K: K tensors each clipped to it have a total norm ≤ C."""
    return max_grad_norm / math.sqrt(num_tensors)


def add_weighted_sum_(into: torch.Tensor, factors: torch.Tensor, per_example: torch.Tensor) -> None:
    """``into += Σ_i factors[i] · per_example[i]`` for materialised ``(B, *shape)`` gradients."""
    into.view(-1).addmv_(per_example.reshape(len(factors), -1).T, factors)


def squared_norms(per_example: torch.Tensor) -> torch.Tensor:
    """‖g_i‖² for materialised ``(B, *shape)`` gradients."""
    return torch.linalg.vector_norm(per_example.reshape(per_example.shape[0], -1), dim=1).square()
