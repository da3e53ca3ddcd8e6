"""Shared test fixtures: the MNIST files in ../shared/data (never downloaded in tests)."""

from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """Root folder holding MNIST/raw in torchvision's layout."""
    if not (SHARED_DATA / "MNIST" / "raw" / "train-images-idx3-ubyte").exists():
        pytest.fail(f"MNIST files not found under {SHARED_DATA}; see ../shared/data/README.md")
    return SHARED_DATA
