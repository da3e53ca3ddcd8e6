"""A fedpriv task on images: scikit-learn's handwritten digits (1,797 grey 8×8 images,
10 classes), written once by ``prepare`` as PNG files in torchvision's ``ImageFolder``
layout (``<split>/<class>/<n>.png``) and read back with ``ImageFolder``.

The model normalises with GroupNorm, never BatchNorm (which mixes the examples of a
batch: fedpriv refuses it). Each node's share is fedpriv's keyed per-record rule.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedpriv.task import keyed_share

RUN_CONFIG = {"lr": 1.0, "max-grad-norm": 1.0, "lot-size": 128, "local-epochs": 1, "rounds": 3}
FLOOR = 0.60
"""Test accuracy the template's tests require (chance is 0.10)."""
FOLDER = "digits"


def model() -> nn.Module:
    """Conv 3×3 (16) → GroupNorm → tanh → max-pool → Linear: 1×8×8 images to 10 classes."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.Tanh(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
    )


def load_data(partition_id: int, num_partitions: int, data_dir: Path
              ) -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    """This node's share of the training images, and the test images."""
    train = keyed_share(_folder(data_dir / FOLDER / "train"), partition_id, num_partitions)
    return train, _folder(data_dir / FOLDER / "test")


def _folder(path: Path) -> torch.utils.data.Dataset:
    """The images under ``path`` as ``ImageFolder`` reads them: grey, in [-1, 1]."""
    from torchvision import datasets, transforms

    to_tensor = transforms.Compose([transforms.Grayscale(), transforms.ToTensor(), transforms.Normalize([0.5], [0.5])])
    return datasets.ImageFolder(str(path), transform=to_tensor)


def prepare(data_dir: Path) -> None:
    """Write the digits as 8×8 PNG files: a fixed, stratified 80/20 split."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    pixels = (bunch.images * (255 / 16)).round().astype(np.uint8)
    parts = train_test_split(pixels, bunch.target, test_size=0.2, stratify=bunch.target, random_state=0)
    for split, images, labels in (("train", parts[0], parts[2]), ("test", parts[1], parts[3])):
        for n, (image, label) in enumerate(zip(images, labels, strict=True)):
            folder = data_dir / FOLDER / split / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image, mode="L").save(folder / f"{n}.png")
