"""Nothing a test starts outlives it: a process orphaned mid-test (as when a deployment
test kills its SuperLink, whose SuperExec lives in a session of its own) is found by its
mark and stopped by the finaliser; the session-end check fails a run that leaves one."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from simulations._processes import Processes, base_env, start_time
from tests.processes import leftovers
from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[1]

# A "SuperLink": starts a detached "SuperExec" (its own session, as Flower's is), says where
# it is, and waits.
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    return start_time(pid) is not None


def test_a_process_orphaned_mid_test_is_found_and_the_finaliser_leaves_none(tmp_path, process_mark):
    # Prepare: the parent started as the deployment helpers start theirs, and its child ready
    pid_file = tmp_path / "child.pid"
    processes = Processes()
    parent = processes.start("parent", [sys.executable, "-c", PARENT, str(pid_file)], base_env(), tmp_path / "p.log")
    processes.wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", parent, scaled(60),
                         "start its child")
    child = int(pid_file.read_text())
    # Execute: kill the parent's group mid-way (the test's SuperLink kill); then the finaliser
    os.killpg(parent.process.pid, 9)
    parent.process.wait()
    orphaned = leftovers(process_mark)
    processes.stop_all()
    # Assert: the orphan (now init's child) was found by its mark; afterwards none is left
    assert child in orphaned and parent.process.pid not in orphaned
    assert not _alive(child)
    assert leftovers(process_mark) == {}


INNER = textwrap.dedent("""
    import os, subprocess, sys
    import pytest

    SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]

    @pytest.fixture(scope="module")
    def forgotten(tmp_path_factory):
        process = subprocess.Popen(SLEEP, start_new_session=True)  # never stopped
        open(os.environ["PIDS"] + ".fixture", "w").write(str(process.pid))

    def test_leaves_an_orphan():
        process = subprocess.Popen(SLEEP, start_new_session=True)
        open(os.environ["PIDS"] + ".test", "w").write(str(process.pid))

    def test_uses_the_forgotten_fixture(forgotten):
        pass
""")


def test_the_session_end_check_fails_a_run_that_leaves_a_process(tmp_path):
    # Prepare: a session whose test leaves a process, and whose module fixture leaves another
    (tmp_path / "test_inner.py").write_text(INNER)
    pids = tmp_path / "pid"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},  # not an xdist worker's
           "PYTHONPATH": str(ROOT), "PIDS": str(pids)}
    # Execute: that session under this project's conftest, without xdist (the check's own path)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "tests.conftest", "--basetemp", str(tmp_path / "inner-tmp"), "test_inner.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(300))
    # Assert: the test's orphan was stopped by its finaliser; the fixture's was caught at the
    # session's end, which failed the run, and stopped
    fixture_pid, test_pid = (int(Path(f"{pids}.{which}").read_text()) for which in ("fixture", "test"))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed, 1 error" in done.stdout
    assert "1 process(es) started by this test session outlived it" in done.stdout
    assert f"pid {fixture_pid}:" in done.stdout and f"pid {test_pid}:" not in done.stdout
    assert not _alive(fixture_pid) and not _alive(test_pid)
