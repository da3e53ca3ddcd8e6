"""Shared test fixtures: the MNIST files in ../shared/data (never downloaded in tests);
two workers by default (pytest-xdist), the tests that start clusters on one of them; and
nothing a test starts outlives it."""

import ast
import functools
import gc
import itertools
import os
import time
import uuid
from pathlib import Path

import pytest

from tests.processes import MARK_ENV, describe, leftovers, reap
from tests.timeouts import ray_start_waits, scaled

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
WORKERS = 2
"""pytest-xdist workers when no ``-n`` is given (``-n 0`` or ``-p no:xdist``: none)."""
CLUSTER = "cluster"
"""The mark of a test that starts a Ray cluster or a Flower deployment (pyproject's
markers): many processes each, mostly waiting, so xdist runs them one at a time on one
worker while the others fill the second; ``-m "not cluster"`` leaves them out."""
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
    """``--dist loadgroup`` with the ``cluster`` tests as one group, chosen here by node id
    (xdist's ``xdist_group`` mark renames node ids, which pytest 9.2 ignores; the scheduler
    sees node ids only, so the marks are read from the test files: ``cluster_node_ids``)."""
    if config.option.dist != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    clusters = cluster_node_ids()

    class ClustersApart(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "clusters" if _in(nodeid, clusters) else super()._split_scope(nodeid)

    return ClustersApart(config, log)


@functools.cache
def cluster_node_ids() -> tuple[str, ...]:
    """Node ids (of modules, or of functions with all their parameters) marked ``cluster``
    in the test files: a module's ``pytestmark`` or a test function's decorator."""
    def marked(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr == CLUSTER for n in ast.walk(node))

    found = []
    for path in sorted((PROJECT_ROOT / "tests").rglob("test_*.py")):
        module = ast.parse(path.read_text(), str(path))
        name = path.relative_to(PROJECT_ROOT).as_posix()
        if any(isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in s.targets)
               and marked(s.value) for s in module.body):
            found.append(name)
        found += [f"{name}::{s.name}" for s in module.body
                  if isinstance(s, ast.FunctionDef) and any(marked(d) for d in s.decorator_list)]
    return tuple(found)


def _in(nodeid: str, prefixes: tuple[str, ...]) -> bool:
    return any(nodeid == p or nodeid.startswith((f"{p}::", f"{p}[")) for p in prefixes)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The marks ``cluster_node_ids`` reads are the marks pytest sees (a mark given another
    way, e.g. in ``pytest.param``, would run a cluster beside another)."""
    clusters = cluster_node_ids()
    differ = [item.nodeid for item in items if (item.get_closest_marker(CLUSTER) is not None)
              != _in(item.nodeid, clusters)]
    if differ:
        raise pytest.UsageError(f"mark these {CLUSTER} as a module's pytestmark or a test's decorator: "
                                f"{', '.join(differ)}")


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):
    """Collection imports scipy, Flower, hypothesis and every test module: millions of objects
    that live as long as the process, which the cyclic GC would scan again and again (about
    a sixth of collection's time). It is off while they load; then they are frozen (out of
    the GC's generations, as ``gc.freeze`` is meant for) and it is on again for the tests."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.freeze()
        gc.enable()


def pytest_configure(config: pytest.Config) -> None:
    """Mark every process this session starts (see tests/processes.py); fedpriv's limit on
    Ray's start and Ray's own start-up waits (``tests.timeouts.RAY_START_WAITS``) scale with
    the tests' (``$FEDPRIV_TEST_TIMEOUT_SCALE``): a busy machine slows a cluster test down
    rather than failing it. A value already in the environment is kept."""
    os.environ[MARK_ENV] = SESSION
    os.environ.setdefault("FEDPRIV_RAY_START_TIMEOUT", f"{scaled(300):g}")
    for name, seconds in ray_start_waits().items():
        os.environ.setdefault(name, seconds)


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
