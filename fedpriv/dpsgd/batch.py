"""Batch gradients for the non-private schedule (σ = 0, C = ∞): one backward of the
micro-batch's summed loss instead of per-example gradients.

With nothing clipped and no noise, Σ_i g_i is the gradient of Σ_i loss_i, so the step
(same Poisson lots, divisor, optimizer and LR) equals the per-example paths' up to float
rounding, at the cost of one ordinary backward: user-level training (``clients.userlevel``)
and other plain schedules run at the speed of an ordinary training loop.

Non-finite gradients: every path drops an example whose gradient is not finite
(``clipping``) and reports the sum of the finite losses. A batch gradient cannot say which
example it came from, so a micro-batch whose summed loss or gradient is not finite is
recomputed by the per-example path, which drops exactly those examples.

Privacy never rides on this path: ``batch_gradient_sum`` refuses any config with noise or
clipping, and ``engine.clipped_sum_function`` takes it only for such a plain config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from fedpriv.dpsgd.augmentation import copies
from fedpriv.dpsgd.clipping import ClippedSumFn
from fedpriv.dpsgd.config import DPSGDConfig
from fedpriv.dpsgd.per_example import LossFn


def is_plain(config: DPSGDConfig) -> bool:
    """No noise and no clipping: the schedule of ``TrainingPlan.non_private``."""
    return config.noise_multiplier == 0 and math.isinf(config.max_grad_norm)


def batch_gradient_sum(
    model: nn.Module, params: dict[str, torch.Tensor], loss_fn: LossFn, config: DPSGDConfig,
    per_example: ClippedSumFn,
) -> ClippedSumFn:
    """``clipped_sum(features, labels, into)`` adding Σ_i g_i (unclipped) from one batched
    backward, or ``per_example``'s sum where that gradient is not finite; ``ValueError``
    for a config with noise or clipping."""
    if not is_plain(config):
        raise ValueError("batch gradients are for the non-private schedule only (noise_multiplier = 0, "
                         f"max_grad_norm = inf), got σ = {config.noise_multiplier!r}, C = {config.max_grad_norm!r}")
    tensors = list(params.values())

    def gradient_sum(
        features: torch.Tensor, labels: torch.Tensor, into: Sequence[torch.Tensor], mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if mask is not None:  # a padded micro-batch: only the per-example path can leave rows out
            return per_example(features, labels, into, mask)
        k = copies(features, labels)
        targets = labels if k == 1 else labels.repeat_interleave(k)  # augmented copies, example-major
        total = loss_fn(model(features), targets) * len(labels)  # Σ_i loss_i: the mean's B times
        grads = torch.autograd.grad(total, tensors, allow_unused=True, materialize_grads=True)
        if not bool(torch.stack([total.isfinite(), *(g.isfinite().all() for g in grads)]).all()):
            return per_example(features, labels, into)  # drops the non-finite examples, sums the finite losses
        for buffer, g in zip(into, grads, strict=True):
            buffer.add_(g)
        return total.detach()  # a finite sum: every loss is finite

    return gradient_sum
