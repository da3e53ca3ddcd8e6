"""The mechanisms of what a node releases besides model updates, one copy that the node
(``clients.releases``, which books them) and the audit (``fedpriv.audit.mechanisms``) call.

- ``node_noise``: the node's Gaussian draws (OS CSPRNG, or seeded for simulations).
- ``noisy_count``: the released size N, max(1, round(N + noise)) (post-processing).
- ``noisy_evaluation``: (count, correct, Σ min(loss, L)) with the policy's noise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.dpsgd.noise import secure_normal
from fedpriv.federation.policy import LOSS_CLIP, NodePolicy, Randomness
from fedpriv.seeding import generator


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
    """(count, correct, clipped loss sum) of ``model`` on the data, each plus N(0, s²)
    (the loss sum's noise scaled by ``LOSS_CLIP``, its sensitivity)."""
    model.eval()
    device = next(model.parameters()).device
    correct, loss = 0.0, 0.0
    for start in range(0, len(labels), batch_size):
        x, y = features[start:start + batch_size].to(device), labels[start:start + batch_size].to(device)
        logits = model(x)
        per_example = F.cross_entropy(logits, y, reduction="none")
        per_example = torch.where(per_example.isfinite(), per_example, LOSS_CLIP).clamp(0, LOSS_CLIP)
        loss += per_example.sum().item()
        correct += (logits.argmax(dim=1) == y).sum().item()
    noise = node_noise(policy, 3, policy.evaluate_noise, "evaluate", *path).tolist()
    return {"count": len(labels) + noise[0], "correct": correct + noise[1], "loss-sum": loss + LOSS_CLIP * noise[2]}
