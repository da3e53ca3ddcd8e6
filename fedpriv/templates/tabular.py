"""A fedpriv task on tabular data: scikit-learn's breast-cancer data (569 records, 30
features, 2 classes), written once as CSV files by ``prepare``.

The CSV is read with Hugging Face ``datasets`` where it is installed, else with the
``csv`` module (the same rows either way). Each node's share is fedpriv's keyed
per-record rule (``fedpriv.task.keyed_share``): a record's share depends on its own
bytes and the node's partition key alone, so the shares do not move when the file changes.

The features are scaled by fixed, public constants (``SCALE``: the data set's documented
ranges), never by statistics of a node's own records: those would be a release of its own.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from torch import nn

from fedpriv.task import keyed_share

RUN_CONFIG = {"lr": 4.0, "max-grad-norm": 1.0, "lot-size": 128, "local-epochs": 5, "rounds": 3}
FLOOR = 0.75
"""Test accuracy the template's tests require (the majority class alone is 0.63)."""
SCALE = (28.0, 39.0, 190.0, 2500.0, 0.16, 0.35, 0.43, 0.2, 0.3, 0.097, 2.9, 4.9, 22.0, 540.0, 0.031, 0.14, 0.4,
         0.053, 0.079, 0.03, 36.0, 50.0, 250.0, 4300.0, 0.22, 1.1, 1.3, 0.29, 0.66, 0.21)
FILES = {"train": "breast_cancer_train.csv", "test": "breast_cancer_test.csv"}


def model() -> nn.Module:
    """A small tanh MLP: 30 features to 2 classes."""
    return nn.Sequential(nn.Linear(30, 32), nn.Tanh(), nn.Linear(32, 2))


def load_data(partition_id: int, num_partitions: int, data_dir: Path
              ) -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    """This node's share of the training records, and the test records."""
    train = keyed_share(_read(data_dir / FILES["train"]), partition_id, num_partitions)
    return train, _read(data_dir / FILES["test"])


def _read(path: Path) -> torch.utils.data.TensorDataset:
    """(features / SCALE, label) of every row of a CSV file with a ``label`` column."""
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} in the data folder (python -m fedpriv new writes it)")
    try:
        import datasets  # Hugging Face datasets, where installed

        table = datasets.load_dataset("csv", data_files=str(path), split="train").with_format("numpy")
        labels = torch.as_tensor(table["label"], dtype=torch.int64)
        columns = [name for name in table.column_names if name != "label"]
        features = torch.stack([torch.as_tensor(table[name], dtype=torch.float32) for name in columns], dim=1)
    except ImportError:
        with path.open(newline="") as file:
            rows = list(csv.DictReader(file))
        labels = torch.tensor([int(row.pop("label")) for row in rows], dtype=torch.int64)
        features = torch.tensor([[float(v) for v in row.values()] for row in rows], dtype=torch.float32)
    return torch.utils.data.TensorDataset(features / torch.tensor(SCALE), labels)


def prepare(data_dir: Path) -> None:
    """Write scikit-learn's breast-cancer data as two CSV files: a fixed 80/20 split."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    bunch = load_breast_cancer()
    parts = train_test_split(bunch.data, bunch.target, test_size=0.2, stratify=bunch.target, random_state=0)
    names = [str(name).replace(" ", "_") for name in bunch.feature_names]
    data_dir.mkdir(parents=True, exist_ok=True)
    for split, x, y in (("train", parts[0], parts[2]), ("test", parts[1], parts[3])):
        with (data_dir / FILES[split]).open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow([*names, "label"])
            writer.writerows([*map(float, row), int(label)] for row, label in zip(x, y, strict=True))
