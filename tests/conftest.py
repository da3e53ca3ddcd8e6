"""Shared test fixtures: the MNIST files in ../shared/data (never downloaded in tests);
two workers by default (pytest-xdist), the tests that start clusters on one of them; and
nothing a test starts outlives it."""

import itertools
import os
import time
import uuid
from pathlib import Path

import pytest

from tests.processes import MARK_ENV, describe, leftovers, reap
from tests.timeouts import scaled

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
WORKERS = 2
"""pytest-xdist workers when no ``-n`` is given (``-n 0`` or ``-p no:xdist``: none)."""
CLUSTERS = ("tests/flower/test_deployment.py", "tests/flower/test_deployment_userlevel.py",
            "tests/flower/test_ray_cluster.py", "tests/flower/test_cifar_simulation.py",
            "tests/flower/test_flwr_run.py", "tests/flower/test_simulation.py", "tests/task/test_templates.py",
            "tests/task/test_flwr_app.py",
            "tests/algorithms/test_classic_command.py::test_federated_across_two_flower_clients")
"""Tests that start a Ray cluster or a Flower deployment (many processes each, mostly
waiting): one at a time, on one worker; the others fill the second."""
SESSION = uuid.uuid4().hex[:12]
_TESTS = itertools.count(1)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``-n 2 --dist loadgroup`` unless ``-n`` was given (or xdist is off, or ``--pdb``)."""
    if (config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput")
            and config.option.numprocesses is None and not config.option.usepdb):
        config.option.numprocesses, config.option.dist = WORKERS, "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with the cluster tests as one group, chosen here by node id
    (xdist's ``xdist_group`` mark renames node ids, which pytest 9.2 ignores)."""
    if config.option.dist != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ClustersApart(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "clusters" if nodeid.startswith(CLUSTERS) else super()._split_scope(nodeid)

    return ClustersApart(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Mark every process this session starts (see tests/processes.py); Ray's start limit
    scales with the tests' (``$FEDPRIV_TEST_TIMEOUT_SCALE``)."""
    os.environ[MARK_ENV] = SESSION
    os.environ.setdefault("FEDPRIV_RAY_START_TIMEOUT", f"{scaled(300):g}")


@pytest.fixture(scope="session", autouse=True)
def nothing_outlives_the_session():
    """Fail the run if a process this session started still runs at its end (after a
    grace for ones on their way out), and stop it."""
    yield
    deadline = time.monotonic() + scaled(10)
    while (found := leftovers(SESSION)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if found:
        reap(found, timeout=scaled(10))
        pytest.fail(f"{len(found)} process(es) started by this test session outlived it (stopped now): "
                    f"{describe(found)}", pytrace=False)


@pytest.fixture(autouse=True)
def process_mark():
    """Every process the test starts (its own children, theirs, orphans) carries the
    test's mark; whatever still runs after the test's own finalisers is stopped."""
    from simulations._processes import descendants

    known = frozenset(descendants(os.getpid()))
    mark = f"{SESSION}/{next(_TESTS)}"
    os.environ[MARK_ENV] = mark
    yield mark
    os.environ[MARK_ENV] = SESSION
    reap(leftovers(mark, known), timeout=scaled(10))


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """Root folder holding MNIST/raw in torchvision's layout."""
    if not (SHARED_DATA / "MNIST" / "raw" / "train-images-idx3-ubyte").exists():
        pytest.fail(f"MNIST files not found under {SHARED_DATA}; see ../shared/data/README.md")
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def private_feature_cache(tmp_path_factory, pytestconfig):
    """Tests (and the commands they start, which inherit the environment) cache features
    in a folder of the run's own, never in the user's cache; xdist's workers share it (an
    entry is written atomically, so a reader sees all of it or none)."""
    saved = os.environ.get("FEDPRIV_CACHE_DIR")
    if not hasattr(pytestconfig, "workerinput"):  # not an xdist worker
        folder = tmp_path_factory.mktemp("feature-cache")
    else:  # the run's folder, above each worker's own
        folder = tmp_path_factory.getbasetemp().parent / "feature-cache"
        folder.mkdir(exist_ok=True)
    os.environ["FEDPRIV_CACHE_DIR"] = str(folder)
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
