"""Tiny models and data for the DP-SGD tests (all CPU, all seconds-fast)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn


def tiny_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.GroupNorm(3, 12), nn.ReLU(), nn.Linear(12, 3))


def tiny_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, stride=2, padding=1),  # 4×2×2
        nn.GroupNorm(2, 4),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(16, 3),
    )


def rgb_cnn() -> nn.Module:
    """For 3×7×7 inputs (whose memory format is not ambiguous, unlike one channel's): a
    padded and an unpadded convolution with a max-pool between them."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2, 1),  # 4×6×6
        nn.Conv2d(4, 5, 2, stride=2), nn.Tanh(), nn.Flatten(), nn.Linear(45, 3),  # 5×3×3
    )


class SequenceModel(nn.Module):
    """Linear layers on (B, T, d) inputs (the materialising branch of the Linear rule),
    and a layer that never runs (zero gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)
        self.unused = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(x.view(len(x), 4, 4))).mean(1))


TINY_MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlp": tiny_mlp,
    "cnn": tiny_cnn,
    "sequence": SequenceModel,
    "rgb_cnn": rgb_cnn,
}


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TINY_MODELS[name]()


def make_data(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 4, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def generators(sampling: int = 1, noise: int = 2) -> dict[str, torch.Generator]:
    return {
        "sampling_generator": torch.Generator().manual_seed(sampling),
        "noise_generator": torch.Generator().manual_seed(noise),
    }


@pytest.fixture
def data() -> tuple[torch.Tensor, torch.Tensor]:
    return make_data()
