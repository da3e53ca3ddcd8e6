"""Plain per-example gradients with ``torch.func``: ``vmap(grad(loss of one example))``.

Works for any model without batch-mixing layers and is the reference every faster path is
tested against.  Memory is B × (number of parameters) floats per micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedpriv.dpsgd.augmentation import copies
from fedpriv.dpsgd.clipping import add_weighted_sum_, clip_factors, finite_sum, squared_norms
from fedpriv.dpsgd.config import DPSGDConfig

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss_fn(outputs, targets)`` → the *mean* loss over the batch (PyTorch's default)."""


def per_example_losses(loss_fn: LossFn, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B,) losses of each example alone, from a batch's outputs: ``loss_fn`` on batches of one."""

    def example_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output.unsqueeze(0), target.unsqueeze(0))

    return vmap(example_loss)(outputs, targets)


def per_example_gradients(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    features: torch.Tensor,
    labels: torch.Tensor,
    loss_fn: LossFn,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """({name: (B, *shape) gradients of each example's loss}, (B,) per-example losses).

    Each example runs as a batch of its K copies (``augmentation.copies``; 1 without
    augmentation), so its gradient cannot depend on the others and is the mean over its
    copies; ``randomness="different"`` gives each example its own dropout mask.
    """
    detached = {name: p.detach() for name, p in params.items()}

    def example_loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss_fn(functional_call(model, p, (x,)), y.expand(len(x), *y.shape))  # a target per copy

    per_example = vmap(grad_and_value(example_loss), in_dims=(None, 0, 0), randomness="different")
    return per_example(detached, features.unflatten(0, (len(labels), copies(features, labels))), labels)


def vmap_clipped_sum(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    features: torch.Tensor,
    labels: torch.Tensor,
    into: Sequence[torch.Tensor],
    mask: torch.Tensor | None = None,
    *,
    loss_fn: LossFn,
    config: DPSGDConfig,
) -> torch.Tensor:
    """Add Σ_i clip(g_i) per parameter tensor into ``into``, by materialising every g_i
    (examples with a non-finite gradient, and rows ``mask`` leaves out, left out); return
    Σ_i loss_i over finite losses."""
    grads, losses = per_example_gradients(model, params, features, labels, loss_fn)
    per_example = list(grads.values())
    sq_norms = [squared_norms(g) for g in per_example]
    factors, keep = clip_factors(sq_norms, config.max_grad_norm, config.clipping, mask)
    for buffer, f, g in zip(into, factors, per_example, strict=True):
        add_weighted_sum_(buffer, f, g, keep)
    return finite_sum(losses, mask)
