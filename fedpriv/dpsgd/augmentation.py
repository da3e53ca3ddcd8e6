"""Augmentation multiplicity (De et al. 2022): K augmented copies of each example, whose
gradients are averaged into the example's one gradient *before* it is clipped.

Example i's gradient is (1/K) Σ_k ∇ℓ(aug_k(x_i)): still one gradient per example, clipped
to C, so the sensitivity, the lots, the noise and the privacy event are those of K = 1.
The copies reach the clipped-sum paths example-major: rows iK … iK + K − 1 of a
micro-batch's inputs are example i's, and every path reads K as len(inputs) / len(labels)
(``copies``).  The augmentations' randomness is data processing, not privacy: it has its
own generator, never the noise's or the lots'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Transform = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
"""``transform(examples, generator)``: one random augmentation of each of a batch's stored
examples, as the model's inputs (a fixed feature map may follow the augmentation)."""


@dataclass(frozen=True)
class Augmentation:
    """``multiplicity`` copies of each example through ``transform``; ``input_shape`` is one
    model input's shape (the physical batch is planned for it)."""

    multiplicity: int
    transform: Transform
    generator: torch.Generator
    input_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.multiplicity, int) or isinstance(self.multiplicity, bool) or self.multiplicity < 1:
            raise ValueError(f"multiplicity must be an integer >= 1, got {self.multiplicity!r}")

    def __call__(self, examples: torch.Tensor) -> torch.Tensor:
        """(B·K, *input_shape): each example's K augmented copies, example-major."""
        copies = [self.transform(examples, self.generator) for _ in range(self.multiplicity)]
        return torch.stack(copies, 1).flatten(0, 1)


def copies(inputs: torch.Tensor, labels: torch.Tensor) -> int:
    """K, the copies of each example in a micro-batch of ``inputs`` for ``labels``."""
    k, rest = divmod(len(inputs), len(labels)) if len(labels) else (1, 0)
    if rest or k < 1:
        raise ValueError(f"{len(inputs)} inputs are not a whole number of copies of {len(labels)} examples")
    return k


def random_shift(max_shift: int) -> Transform:
    """Each image (B, C, H, W) moved by its own uniform offset in [−s, s]² pixels, zero-filled
    (MNIST's augmentation: its digits are centred, flips would change them)."""

    def shift(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        b, _, h, w = images.shape
        offsets = torch.randint(0, 2 * max_shift + 1, (2, b), generator=generator, device=generator.device)
        offsets = offsets.to(images.device)
        padded = torch.nn.functional.pad(images, (max_shift,) * 4).permute(0, 2, 3, 1)  # (B, H', W', C)
        rows = (offsets[0, :, None] + torch.arange(h, device=images.device))[:, :, None]
        cols = (offsets[1, :, None] + torch.arange(w, device=images.device))[:, None, :]
        return padded[torch.arange(b, device=images.device)[:, None, None], rows, cols].permute(0, 3, 1, 2)

    return shift
