"""The mechanisms of what a node releases besides model updates, one copy that the node
(``clients.releases``, which books them) and the audit (``fedpriv.audit.mechanisms``) call.

- ``node_noise``: the node's Gaussian draws (OS CSPRNG, or seeded for simulations).
- ``noisy_count``: the released size N, max(1, round(N + noise)) (post-processing).
- ``noisy_evaluation``: the integers (count, correct, loss steps) with the policy's discrete
  Gaussian noise.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.dpsgd.noise import secure_normal
from fedpriv.federation.policy import EVALUATE_UNITS, LOSS_CLIP, LOSS_STEPS, NodePolicy, Randomness
from fedpriv.mechanisms.gaussian import discrete_gaussian_mechanism
from fedpriv.seeding import derive_seed, generator


def node_noise(policy: NodePolicy, size: int, std: float, *path: int | str) -> torch.Tensor:
    """``size`` float64 N(0, std²) draws: OS CSPRNG, or the node's seed and ``path``."""
    if policy.randomness is Randomness.SECURE:
        return secure_normal(size, std)
    gen = generator(policy.seed or 0, "release", *path)
    return torch.randn(size, dtype=torch.float64, generator=gen) * std


def noisy_count(count: int, noise: float) -> int:
    """The released size: ``count`` + ``noise``, rounded and floored at 1."""
    return max(1, round(count + noise))


@torch.no_grad()
def noisy_evaluation(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, policy: NodePolicy,
                     *path: int | str, batch_size: int = 4096) -> dict[str, float]:
    """(count, correct, clipped loss sum) of ``model`` on the data, each an integer (the loss
    sum in steps of ``LOSS_CLIP / LOSS_STEPS``, each record's clipped loss snapped before it is
    summed) plus discrete Gaussian noise of std ``evaluate-noise`` per unit of sensitivity
    (``fedpriv.mechanisms.gaussian``): OS CSPRNG, or the node's seed and ``path``."""
    model.eval()
    device = next(model.parameters()).device
    correct, loss_steps = 0, 0
    for start in range(0, len(labels), batch_size):
        x, y = features[start:start + batch_size].to(device), labels[start:start + batch_size].to(device)
        logits = model(x)
        per_example = F.cross_entropy(logits, y, reduction="none").double()
        per_example = torch.where(per_example.isfinite(), per_example, LOSS_CLIP).clamp(0, LOSS_CLIP)
        loss_steps += int(torch.round(per_example * (LOSS_STEPS / LOSS_CLIP)).sum().item())
        correct += int((logits.argmax(dim=1) == y).sum().item())
    rng = None if policy.randomness is Randomness.SECURE else \
        np.random.default_rng(derive_seed(policy.seed or 0, "release", "evaluate", *path))
    count, correct, loss_steps = discrete_gaussian_mechanism(
        [len(labels), correct, loss_steps], noise_stddev=policy.evaluate_noise, units=EVALUATE_UNITS, generator=rng)
    return {"count": float(count), "correct": float(correct), "loss-sum": float(loss_steps) * (LOSS_CLIP / LOSS_STEPS)}
