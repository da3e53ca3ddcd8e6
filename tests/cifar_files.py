"""Tiny CIFAR-10 files in the original pickle format, for tests (CIFAR-10 can't be had here)."""

import hashlib
import pickle
from pathlib import Path

import numpy as np

LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_cifar10(root: Path, per_batch: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Write ``cifar-10-batches-py`` under ``root``; returns (images per file, md5 per file).

    torchvision checks every file against its md5 table; tests point the table at these
    files (``CIFAR10.train_list`` / ``test_list`` / ``meta``) instead of bypassing the check.
    """
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images, md5 = {}, {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        (folder / name).write_bytes(pickle.dumps({"data": data, "labels": labels, "batch_label": name}))
        images[name] = data
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": LABEL_NAMES}))
    for path in folder.iterdir():
        md5[path.name] = hashlib.md5(path.read_bytes()).hexdigest()
    return images, md5


def md5_tables(md5: dict[str, str]) -> dict[str, object]:
    """torchvision's CIFAR10 class attributes that name these files' checksums."""
    return {
        "train_list": [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)],
        "test_list": [["test_batch", md5["test_batch"]]],
        "meta": {"filename": "batches.meta", "key": "label_names", "md5": md5["batches.meta"]},
    }
