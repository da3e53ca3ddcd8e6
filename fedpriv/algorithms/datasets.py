"""The small data sets the classic algorithms run on (they ship inside scikit-learn), a
seeded train/test split, and an IID share of the training part per client."""

from __future__ import annotations

import numpy as np

LOADERS = {"diabetes": "load_diabetes", "iris": "load_iris", "digits": "load_digits"}
TEST_FRACTION = 0.2


def load(name: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of ``name``, split by ``seed``."""
    if name not in LOADERS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(LOADERS)}")
    import sklearn.datasets

    x, y = getattr(sklearn.datasets, LOADERS[name])(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(round(len(y) * (1 - TEST_FRACTION)))
    train, test = order[:cut], order[cut:]
    return x[train].astype(float), y[train].astype(float), x[test].astype(float), y[test].astype(float)


def client_share(x: np.ndarray, y: np.ndarray, client: int, clients: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``client``'s IID share of ``(x, y)`` out of ``clients`` (disjoint, covering)."""
    if not 0 <= client < clients:
        raise ValueError(f"client {client} is not one of {clients}")
    order = np.random.default_rng([seed, clients]).permutation(len(y))
    mine = np.array_split(order, clients)[client]
    return x[mine], y[mine]
