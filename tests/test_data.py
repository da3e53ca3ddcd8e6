"""Data loaders: MNIST from the shared folder, CIFAR-10 through torchvision's real loader on
tiny files in CIFAR-10's pickle format, DIGITS / iris, and the missing-data error."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

from fedpriv.data import DatasetNotFoundError, default_data_dir, load_dataset
from tests.cifar_files import md5_tables, write_cifar10


def test_mnist_shapes_dtypes_normalisation(shared_data_dir: Path) -> None:
    train = load_dataset("mnist", shared_data_dir, train=True)
    test = load_dataset("mnist", shared_data_dir, train=False)
    assert train.features.shape == (60_000, 1, 28, 28) and test.features.shape == (10_000, 1, 28, 28)
    assert train.features.dtype == torch.float32 and train.labels.dtype == torch.int64
    assert abs(train.features.mean().item()) < 0.01 and abs(train.features.std().item() - 1) < 0.01
    assert set(train.labels.tolist()) == set(range(10))


def test_mnist_limit_keeps_first_examples(shared_data_dir: Path) -> None:
    full = load_dataset("mnist", shared_data_dir, train=False)
    head = load_dataset("mnist", shared_data_dir, train=False, limit=100)
    assert head.features.shape == (100, 1, 28, 28)
    assert torch.equal(head.features, full.features[:100]) and torch.equal(head.labels, full.labels[:100])


def _write_cifar(root: Path, per_batch: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:
    """Tiny CIFAR-10 files in the original format; torchvision's md5 table is pointed at them."""
    written, md5 = write_cifar10(root, per_batch)
    for name, value in md5_tables(md5).items():
        monkeypatch.setattr(torchvision.datasets.CIFAR10, name, value)
    return written


def test_cifar10_through_torchvision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = _write_cifar(tmp_path, per_batch=4, monkeypatch=monkeypatch)
    train = load_dataset("cifar10", tmp_path, train=True)
    test = load_dataset("cifar10", tmp_path, train=False, limit=3)
    assert train.features.shape == (20, 3, 32, 32) and test.features.shape == (3, 3, 32, 32)
    assert train.features.dtype == torch.float32 and train.labels.dtype == torch.int64
    # First image, red channel, top-left pixel: CHW layout, (x/255 - mean)/std.
    expected = (written["data_batch_1"][0, 0] / 255.0 - 0.4914) / 0.2470
    assert train.features[0, 0, 0, 0].item() == pytest.approx(expected, abs=1e-5)


def test_cifar10_corrupted_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_cifar(tmp_path, per_batch=2, monkeypatch=monkeypatch)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(DatasetNotFoundError, match="CIFAR10"):
        load_dataset("cifar10", tmp_path)


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_missing_data_gives_clear_error(name: str, tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"download=True \(--download\).*--data-dir"):
        load_dataset(name, tmp_path / "empty")


def test_digits_and_iris_split() -> None:
    digits_train, digits_test = load_dataset("digits"), load_dataset("digits", train=False)
    assert digits_train.features.shape[1:] == (1, 8, 8)
    assert len(digits_train.labels) + len(digits_test.labels) == 1797
    assert 0.0 <= digits_train.features.min() and digits_train.features.max() <= 1.0
    iris_train, iris_test = load_dataset("iris", seed=1), load_dataset("iris", train=False, seed=1)
    assert iris_train.features.shape == (120, 4) and iris_test.features.shape == (30, 4)
    assert torch.allclose(iris_train.features.mean(0), torch.zeros(4), atol=1e-5)
    assert torch.equal(load_dataset("iris", seed=1).features, iris_train.features)
    assert not torch.equal(load_dataset("iris", seed=2).features, iris_train.features)


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / "fedpriv"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_data_dir() == Path.home() / ".cache" / "fedpriv"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown data set"):
        load_dataset("svhn")
    with pytest.raises(ValueError, match="limit"):
        load_dataset("digits", limit=0)
