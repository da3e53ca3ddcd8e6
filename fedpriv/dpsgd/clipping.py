"""Clip factors: how much each example's gradient is scaled so its norm is at most C.

Every gradient path reports, per trainable parameter tensor, the squared per-example norms
(shape ``(B,)``); the factors computed here are then applied *before* summing, so the sum of
clipped gradients has L2 sensitivity ≤ C (add/remove one example).  Sums are added into
caller-owned buffers (``ClippedSumFn``), so a step allocates no parameter-sized tensors.  Factor
``C / max(‖g‖, C)`` is exactly 1 for small gradients and never needs an epsilon.

Non-finite gradients: an example whose squared norms, summed over all tensors, are not
finite (a NaN or ±Inf entry anywhere, or an overflowing norm) is *dropped*: ``clip_factors``
returns a ``keep`` mask, and every gradient path selects that example's rows out with
``drop_rows`` (``torch.where``, never a multiplication by 0: 0·NaN = NaN) before summing.
Otherwise one such example would make the whole noisy sum NaN whatever σ, and a server
choosing weights that make one record's gradient non-finite would learn, from the update's
finiteness, whether that record was sampled.  Dropping keeps every example's contribution
bounded by C (zero is), so the privacy analysis is unchanged.  In the common all-finite
case ``keep`` is None and nothing is copied; the check costs one reduction over (B,) norms
and one host sync per micro-batch.  The same rule holds with ``max_grad_norm = inf``.

Masked rows: a micro-batch padded to a fixed shape (``static``) passes a ``mask``; its
False rows (padding) are dropped like non-finite ones, always by selection, so they add
exactly 0 whatever their values, and nothing waits for the device (no host sync: the step
can be captured in a CUDA graph).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch

from fedpriv.dpsgd.config import Clipping


class ClippedSumFn(Protocol):
    """``clipped_sum(features, labels, into, mask=None)``: add Σ_i clipped g_i of the
    micro-batch into ``into`` (one contiguous buffer per trainable parameter tensor, whatever
    the parameter's memory format, in place); return Σ_i loss_i.  With a (B,) bool ``mask``,
    only the rows where it is True count (the rest add exactly 0), with no host sync."""

    def __call__(
        self, features: torch.Tensor, labels: torch.Tensor, into: Sequence[torch.Tensor],
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

Keep = torch.Tensor | None
"""``clip_factors``' (B,) bool mask of the examples kept; None when all are (nothing to copy)."""


def clip_factors(
    sq_norms: Sequence[torch.Tensor], max_grad_norm: float, clipping: Clipping, mask: torch.Tensor | None = None
) -> tuple[list[torch.Tensor], Keep]:
    """Per parameter tensor, the ``(B,)`` factors for ``sq_norms[k][i] = ‖g_{i,k}‖²``, and
    ``keep``: None when every example is finite, else the ``(B,)`` mask of finite examples;
    with a ``mask``, always the mask of the finite examples it holds (no host sync).

    ``FLAT``: one factor per example from its total norm, bound C.  ``PER_LAYER``: one factor
    per (example, tensor), bound C/√K for K tensors.  ``max_grad_norm = inf``: all ones.
    A dropped example's factors are 0 in every tensor; its gradient rows must still be
    removed with ``drop_rows`` (they may hold NaN).
    """
    total = sq_norms[0] if len(sq_norms) == 1 else torch.stack(list(sq_norms)).sum(0)
    finite = torch.isfinite(total)
    if mask is not None:
        keep: Keep = finite & mask
    else:
        keep = None if bool(finite.all()) else finite
    if math.isinf(max_grad_norm):
        factors = [torch.ones_like(total)] * len(sq_norms)
    elif clipping is Clipping.FLAT:
        factors = [max_grad_norm / total.sqrt().clamp(min=max_grad_norm)] * len(sq_norms)
    else:
        bound = per_layer_bound(max_grad_norm, len(sq_norms))
        factors = [bound / n.sqrt().clamp(min=bound) for n in sq_norms]
    if keep is not None:
        factors = [drop_rows(f, keep) for f in factors]
    return factors, keep


def drop_rows(per_example: torch.Tensor, keep: Keep) -> torch.Tensor:
    """``per_example`` (B, ...) with the rows of dropped examples set to exactly 0 (by
    selection, so NaN and Inf go too); itself, uncopied, when ``keep`` is None."""
    if keep is None:
        return per_example
    return torch.where(keep.view(-1, *[1] * (per_example.dim() - 1)), per_example, 0)


def finite_sum(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Σ of the finite entries of ``values`` (per-example losses), only where ``mask`` is True if
    given: a non-finite loss is left out of the reported loss rather than making it NaN."""
    keep = torch.isfinite(values) if mask is None else torch.isfinite(values) & mask
    return torch.where(keep, values, 0).sum()


def per_layer_bound(max_grad_norm: float, num_tensors: int) -> float:
    """C/√K: K tensors each clipped to it have a total norm ≤ C."""
    return max_grad_norm / math.sqrt(num_tensors)


def add_weighted_sum_(into: torch.Tensor, factors: torch.Tensor, per_example: torch.Tensor, keep: Keep) -> None:
    """``into += Σ_{i kept} factors[i] · per_example[i]`` for materialised ``(B, *shape)``
    gradients (``factors``, ``keep`` from ``clip_factors``)."""
    into.view(-1).addmv_(drop_rows(per_example, keep).reshape(len(factors), -1).T, factors)


def squared_norms(per_example: torch.Tensor) -> torch.Tensor:
    """‖g_i‖² for materialised ``(B, *shape)`` gradients."""
    return torch.linalg.vector_norm(per_example.reshape(per_example.shape[0], -1), dim=1).square()
