"""Plain evaluation of a model (the server's and the centralized run's test accuracy;
a node's evaluation is the noisy, booked one in ``clients.releases``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate(
    model: nn.Module, features: torch.Tensor, labels: torch.Tensor, batch_size: int = 4096
) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on the data, in batches, without grad."""
    if len(labels) == 0:
        raise ValueError("cannot evaluate on an empty data set")
    model.eval()
    device = next(model.parameters()).device
    loss, correct = 0.0, 0
    for start in range(0, len(labels), batch_size):
        x = features[start : start + batch_size].to(device)
        y = labels[start : start + batch_size].to(device)
        logits = model(x)
        loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(dim=1) == y).sum().item()
    return loss / len(labels), correct / len(labels)
