"""Data sets as tensors: MNIST and CIFAR-10 (torchvision), DIGITS and iris (scikit-learn).

Every loader returns a ``TensorPair`` — float32 features, normalised the usual way, and
int64 labels — already on the requested device. The DP-SGD engine samples Poisson lots
by indexing these tensors, so no DataLoader (and no per-image PIL conversion) is involved:
the image files are read once through torchvision's own dataset classes and their
``data``/``targets`` arrays are converted in one go.

Nothing is downloaded unless the caller passes ``download=True``; a missing data set
raises ``DatasetNotFoundError`` naming the folder and the flag, and a failed download one
saying why. ``check_available`` checks that the files are there without reading them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from fedpriv.seeding import derive_seed

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
SKLEARN_TEST_FRACTION = 0.2
IMAGE_SHAPES = {"mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
TRAIN_SIZES = {"mnist": 60_000, "cifar10": 50_000}


class TensorPair(NamedTuple):
    """Features (float32, N × ...) and labels (int64, N) on one device."""

    features: torch.Tensor
    labels: torch.Tensor


class DatasetNotFoundError(FileNotFoundError):
    """The data set's files are not in ``data_dir`` and downloading was not requested."""


def default_data_dir() -> Path:
    """``$XDG_CACHE_HOME/fedpriv``, or ``~/.cache/fedpriv`` when that is unset."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "fedpriv"


def _not_found(cls: type, data_dir: Path) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"{cls.__name__} not found (or corrupted) under {data_dir}: pass download=True "
        f"(--download) or point data_dir (--data-dir) at the folder that holds it"
    )


def _download_failed(cls: type, data_dir: Path, err: Exception) -> DatasetNotFoundError:
    reason = " ".join(str(err).split()) or type(err).__name__  # torchvision's are several lines
    return DatasetNotFoundError(
        f"downloading {cls.__name__} into {data_dir} (download=True, --download) failed: {reason}")


def _torchvision(cls: type, data_dir: Path, train: bool, download: bool):  # noqa: ANN202
    try:
        return cls(root=str(data_dir), train=train, download=download)
    except RuntimeError as err:  # "Dataset not found or corrupted", or MNIST's failed download
        raise (_download_failed(cls, data_dir, err) if download else _not_found(cls, data_dir)) from err
    except OSError as err:  # CIFAR-10's download: urllib's errors, a folder that can't be written
        if not download:
            raise
        raise _download_failed(cls, data_dir, err) from err


def _mnist(data_dir: Path, train: bool, download: bool, limit: int | None, seed: int) -> TensorPair:
    ds = _torchvision(_torchvision_class("mnist"), data_dir, train, download)
    images, labels = ds.data[:limit], ds.targets[:limit]
    features = (images.float().div_(255.0).sub_(MNIST_MEAN).div_(MNIST_STD)).unsqueeze(1)
    return TensorPair(features, labels.long())


def _cifar10(data_dir: Path, train: bool, download: bool, limit: int | None, seed: int) -> TensorPair:
    ds = _torchvision(_torchvision_class("cifar10"), data_dir, train, download)
    images = torch.from_numpy(np.ascontiguousarray(ds.data[:limit]))  # N × 32 × 32 × 3, uint8
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    features = (images.permute(0, 3, 1, 2).float().div_(255.0) - mean) / std
    return TensorPair(features.contiguous(), torch.tensor(ds.targets[:limit], dtype=torch.int64))


def _split(x: np.ndarray, y: np.ndarray, train: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded train/test split: the same seed gives the same partition."""
    from sklearn.model_selection import train_test_split  # scikit-learn only for its data sets

    parts = train_test_split(
        x, y, test_size=SKLEARN_TEST_FRACTION, stratify=y,
        random_state=derive_seed(seed, "split") % 2**32,
    )
    return (parts[0], parts[2]) if train else (parts[1], parts[3])


def _digits(data_dir: Path, train: bool, download: bool, limit: int | None, seed: int) -> TensorPair:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x, y = _split(bunch.images / 16.0, bunch.target, train, seed)  # pixels 0..16 -> [0, 1]
    features = torch.from_numpy(x[:limit]).float().unsqueeze(1)  # N × 1 × 8 × 8
    return TensorPair(features, torch.from_numpy(y[:limit]).long())


def _iris(data_dir: Path, train: bool, download: bool, limit: int | None, seed: int) -> TensorPair:
    from sklearn.datasets import load_iris

    bunch = load_iris()
    x_train, _ = _split(bunch.data, bunch.target, True, seed)
    x, y = _split(bunch.data, bunch.target, train, seed)
    # Standardise with the training split's statistics (iris is public: no privacy cost).
    x = (x - x_train.mean(axis=0)) / x_train.std(axis=0)
    return TensorPair(torch.from_numpy(x[:limit]).float(), torch.from_numpy(y[:limit]).long())


_LOADERS: dict[str, Callable[[Path, bool, bool, int | None, int], TensorPair]] = {
    "mnist": _mnist,
    "cifar10": _cifar10,
    "digits": _digits,
    "iris": _iris,
}
DATASETS: tuple[str, ...] = tuple(_LOADERS)


def load_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    train: bool = True,
    download: bool = False,
    device: torch.device | str = "cpu",
    limit: int | None = None,
    seed: int = 0,
) -> TensorPair:
    """Data set ``name`` (one of ``DATASETS``) as tensors on ``device``.

    ``limit`` keeps the first N examples (in the data set's own order). ``seed`` only
    matters for DIGITS and iris, which have no official split: it fixes their
    stratified 80/20 train/test partition. ``data_dir`` defaults to ``default_data_dir()``.
    """
    if name not in _LOADERS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    features, labels = _LOADERS[name](root, train, download, limit, seed)
    return TensorPair(features.to(device), labels.to(device))


def _torchvision_files(cls: Any, root: Path) -> list[Path]:
    """The files torchvision's ``cls`` reads under ``root`` (from the class's own tables)."""
    if hasattr(cls, "resources"):  # MNIST: the decompressed idx files in <root>/MNIST/raw
        return [root / cls.__name__ / "raw" / Path(url).stem for url, _ in cls.resources]
    folder = root / cls.base_folder  # CIFAR-10: the pickled batches and their meta file
    return [folder / name for name, _ in cls.train_list + cls.test_list] + [folder / cls.meta["filename"]]


def _torchvision_class(name: str) -> type:
    """torchvision's dataset class of ``name`` (``"mnist"`` or ``"cifar10"``), imported on first
    use: torchvision pulls in torch._dynamo (~1.5 s), which only loading needs."""
    import torchvision

    return {"mnist": torchvision.datasets.MNIST, "cifar10": torchvision.datasets.CIFAR10}[name]


def check_available(
    name: str, data_dir: str | os.PathLike[str] | None = None, download: bool = False
) -> Path:
    """Raise ``DatasetNotFoundError`` (the loader's message) unless data set ``name``'s files
    are under ``data_dir``; with ``download``, fetch missing ones first (``DatasetNotFoundError``
    saying why when that fails). Returns the root folder.

    Cheap: it checks that the files exist and reads none (the loader verifies checksums),
    so a command can check once, before it starts the processes that load the data.
    """
    if name not in _LOADERS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    cls = _torchvision_class(name) if name in ("mnist", "cifar10") else None
    if cls is None or all(path.is_file() for path in _torchvision_files(cls, root)):
        return root  # scikit-learn's data sets ship with it
    if not download:
        raise _not_found(cls, root)
    _torchvision(cls, root, train=True, download=True)  # one download holds every split
    return root
