"""Shared test fixtures: the MNIST files in ../shared/data (never downloaded in tests)."""

import os
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


@pytest.fixture(scope="session", autouse=True)
def private_feature_cache(tmp_path_factory):
    """Tests (and the commands they start, which inherit the environment) cache features
    in a folder of their own, never in the user's cache."""
    saved = os.environ.get("FEDPRIV_CACHE_DIR")
    os.environ["FEDPRIV_CACHE_DIR"] = str(tmp_path_factory.mktemp("feature-cache"))
    yield
    if saved is None:
        os.environ.pop("FEDPRIV_CACHE_DIR", None)
    else:
        os.environ["FEDPRIV_CACHE_DIR"] = saved


@pytest.fixture
def task_identity():
    """Messages need a run/task identity; set a dummy one (as Flower's own tests do)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved


@pytest.fixture
def one_torch_thread():
    """One torch thread for a test of many tiny tensor ops: two threads that contend with
    other jobs for 2 cores wait on each other at every op (several times slower under load)."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
