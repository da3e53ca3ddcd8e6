"""The mechanisms of what a node releases besides model updates, one copy that the node
(``clients.releases``, which books them) and the audit (``fedpriv.audit.mechanisms``) call.

- ``node_noise``: the node's Gaussian draws (OS CSPRNG, or seeded for simulations).
- ``noisy_count``: the released size N, max(1, round(N + noise)) (post-processing).
- ``noisy_evaluation``: the integers (count, correct, loss steps) with the policy's discrete
  Gaussian noise; each record's loss and correctness come from ``RecordScores`` (default
  ``classification_scores``; a user's task gives its own, ``clients.evaluation``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.dpsgd.noise import secure_normal
from fedpriv.federation.policy import EVALUATE_UNITS, LOSS_CLIP, LOSS_STEPS, NodePolicy, Randomness
from fedpriv.mechanisms.gaussian import discrete_gaussian_mechanism
from fedpriv.seeding import derive_seed, generator

RecordScores = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(outputs, targets) of a batch → each record's own loss, shape (B,), and whether it is
correct, a bool tensor of shape (B,)."""


def node_noise(policy: NodePolicy, size: int, std: float, *path: int | str) -> torch.Tensor:
    """``size`` float64 N(0, std²) draws: OS CSPRNG, or the node's seed and ``path``."""
    if policy.randomness is Randomness.SECURE:
        return secure_normal(size, std)
    gen = generator(policy.seed or 0, "release", *path)
    return torch.randn(size, dtype=torch.float64, generator=gen) * std


def noisy_count(count: int, noise: float) -> int:
    """The released size: ``count`` + ``noise``, rounded and floored at 1."""
    return max(1, round(count + noise))


def classification_scores(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each record's cross-entropy and whether its argmax is its class."""
    return F.cross_entropy(outputs, targets, reduction="none"), outputs.argmax(dim=1) == targets


@torch.no_grad()
def noisy_evaluation(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, policy: NodePolicy,
                     *path: int | str, batch_size: int = 4096, scores: RecordScores = classification_scores,
                     loss_clip: float = LOSS_CLIP) -> dict[str, float]:
    """(count, correct, clipped loss sum) of ``model`` on the data, each an integer (the loss
    sum in steps of ``loss_clip / LOSS_STEPS``, each record's loss, by ``scores``, clipped to
    [0, loss_clip] (a non-finite one is ``loss_clip``) and snapped before it is summed) plus
    discrete Gaussian noise of std ``evaluate-noise`` per unit of sensitivity
    (``fedpriv.mechanisms.gaussian``): OS CSPRNG, or the node's seed and ``path``. One record
    moves the integers by at most ``EVALUATE_UNITS`` whatever ``loss_clip`` is: the booked
    ``policy.evaluate_event()`` covers any bound."""
    if not (math.isfinite(loss_clip) and loss_clip > 0):
        raise ValueError(f"loss_clip must be finite and > 0, got {loss_clip!r}")
    model.eval()
    device = next(model.parameters()).device
    correct, loss_steps = 0, 0
    for start in range(0, len(labels), batch_size):
        x, y = features[start:start + batch_size].to(device), labels[start:start + batch_size].to(device)
        losses, hits = scores(model(x), y)
        if losses.shape != (len(y),) or hits.shape != (len(y),) or hits.dtype != torch.bool:
            raise ValueError(f"scores must give (B,) losses and (B,) bools, got {tuple(losses.shape)} and "
                             f"{tuple(hits.shape)} {hits.dtype}")
        per_example = losses.double()
        per_example = torch.where(per_example.isfinite(), per_example, loss_clip).clamp(0, loss_clip)
        loss_steps += int(torch.round(per_example * (LOSS_STEPS / loss_clip)).sum().item())
        correct += int(hits.sum().item())
    rng = None if policy.randomness is Randomness.SECURE else \
        np.random.default_rng(derive_seed(policy.seed or 0, "release", "evaluate", *path))
    count, correct, loss_steps = discrete_gaussian_mechanism(
        [len(labels), correct, loss_steps], noise_stddev=policy.evaluate_noise, units=EVALUATE_UNITS, generator=rng)
    return {"count": float(count), "correct": float(correct), "loss-sum": float(loss_steps) * (loss_clip / LOSS_STEPS)}
