"""What a newcomer's terminal shows while a simulation runs (``simulations._logging.console``):
Flower's deprecation banners, its actors' "Manually terminating ClientAppActor" and Ray's
deprecation warnings go to the log file only; ordinary lines reach the terminal, without
ANSI colour codes where it is not one; everything is undone afterwards."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from logging import INFO, WARNING

from flwr.supercore import log
from flwr.supercore.logger import warn_deprecated_feature

from fedpriv.federation.seeded import SEEDED_RISK
from simulations._logging import command_log, console, terminal_text
from simulations._processes import Processes, base_env
from tests.timeouts import scaled

ESC = "\x1b["
# as Ray's driver prints an actor's line: its prefix coloured by Ray, the level by Flower
ACTOR_WARNING = (f"{ESC}36m(ClientAppActor pid=10593){ESC}0m {ESC}93mWARNING {ESC}0m:   "
                 "Manually terminating ClientAppActor\n")
ACTOR_LINE = f"{ESC}36m(ClientAppActor pid=10593){ESC}0m computing scattering features for 4000 images\n"
DEDUP = (f"{ESC}36m(ClientAppActor pid=1){ESC}0m done{ESC}32m [repeated 2x across cluster] (Ray deduplicates logs "
         "by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see https://docs.ray.io/x for more "
         f"options.){ESC}0m\n")


@contextlib.contextmanager
def terminal():
    """A non-terminal stdout and stderr, with Flower's console handler writing to that stderr
    (set in the test itself: pytest's capture replaces the streams after fixtures run)."""
    err, out = io.StringIO(), io.StringIO()
    handlers = [h for h in logging.getLogger("flwr").handlers if type(h).__name__ == "ConsoleHandler"]
    saved = sys.stdout, sys.stderr, [h.stream for h in handlers]
    sys.stdout, sys.stderr = out, err
    for handler in handlers:
        handler.setStream(err)
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved[:2]
        for handler, stream in zip(handlers, saved[2]):
            handler.setStream(stream)


def test_notices_go_to_the_log_file_only(tmp_path):
    path = tmp_path / "run.log"
    with terminal() as (out, err), console(path):
        warn_deprecated_feature("The `run_simulation` function is deprecated")
        log(INFO, "round 1/5: test accuracy 93.06 %")
        sys.stderr.write(ACTOR_WARNING)
        sys.stderr.write(ACTOR_LINE)
        sys.stdout.write(DEDUP)
        warnings.warn_explicit("Tip: In future versions of Ray, Ray will no longer override accelerator visible "
                               "devices env var", FutureWarning, "/venv/lib/python3.11/site-packages/ray/_private/"
                               "worker.py", 2051)
    shown, logged = err.getvalue() + out.getvalue(), path.read_text()
    for notice in ("DEPRECATED FEATURE", "deprecated feature", "Manually terminating", "In future versions of Ray",
                   "Ray deduplicates logs"):
        assert notice not in shown and notice in logged, notice
    assert "round 1/5: test accuracy 93.06 %" in shown and "round 1/5" in logged
    assert "(ClientAppActor pid=10593) computing scattering features for 4000 images" in shown
    assert "(ClientAppActor pid=1) done [repeated 2x across cluster]\n" in shown
    assert ESC not in shown and ESC not in logged


def test_the_nodes_copies_of_the_seeded_warning_and_flowers_evaluation_notice_go_to_the_log_only(tmp_path):
    """The command prints the seeded-randomness warning once for all its simulated nodes; each
    Ray actor's own copy, and Flower's warning that federated evaluation is off (fedpriv's
    default: the server evaluates), reach the log file only."""
    path = tmp_path / "run.log"
    with terminal() as (out, err), console(path):
        sys.stderr.write(f"fedpriv warning: {SEEDED_RISK}\n")  # the command's own
        for pid in (10593, 10594):
            sys.stderr.write(f"{ESC}36m(ClientAppActor pid={pid}){ESC}0m fedpriv warning: {SEEDED_RISK}\n")
        log(WARNING, "fraction_evaluate is set to 0.0. Federated evaluation will be skipped.")
        log(WARNING, "Node 7 did not describe itself: refused")
    shown, logged = err.getvalue() + out.getvalue(), path.read_text()
    assert shown.count(SEEDED_RISK) == 1 and logged.count(SEEDED_RISK) == 2
    assert "fraction_evaluate" not in shown and "fraction_evaluate is set to 0.0" in logged
    assert "Node 7 did not describe itself" in shown


def test_a_deployed_processs_output_reaches_its_log_without_colours_and_the_terminal_without_notices(tmp_path):
    script = ("print('\\x1b[92mINFO \\x1b[0m: [ROUND 1/2]'); "
              "print('\\x1b[93mWARNING \\x1b[0m: fraction_evaluate is set to 0.0. Federated evaluation skipped.')")
    echo = io.StringIO()
    with Processes() as processes:
        started = processes.start("printer", [sys.executable, "-c", script], base_env(), tmp_path / "p.log",
                                  echo=echo)
        assert processes.wait(started, timeout=scaled(60)) == 0
    logged = (tmp_path / "p.log").read_text()
    assert ESC not in logged and "INFO : [ROUND 1/2]" in logged and "fraction_evaluate" in logged
    assert echo.getvalue() == "INFO : [ROUND 1/2]\n"


def test_console_is_undone_afterwards(tmp_path):
    flwr = logging.getLogger("flwr")
    handlers = list(flwr.handlers)
    with terminal() as (out, err):
        with console(tmp_path / "run.log"):
            pass
        assert sys.stdout is out and sys.stderr is err and flwr.handlers == handlers
        assert all(not h.filters and h.stream is err for h in handlers if type(h).__name__ == "ConsoleHandler")
        warn_deprecated_feature("after the command")
    assert "after the command" in err.getvalue()


def test_other_warnings_still_show(tmp_path):
    with warnings.catch_warnings(record=True) as shown, terminal() as (_, err), console(tmp_path / "run.log"):
        warnings.simplefilter("always")
        warnings.warn_explicit("a user's own deprecation", DeprecationWarning, "/home/me/script.py", 3)
        warnings.warn_explicit("Ray's deprecation", DeprecationWarning, "/v/lib/site-packages/ray/util.py", 3)
        log(WARNING, "Node 7 did not describe itself: refused")
    assert [str(w.message) for w in shown] == ["a user's own deprecation"]
    assert "Node 7 did not describe itself" in err.getvalue()
    assert "Ray's deprecation" in (tmp_path / "run.log").read_text()


def test_colours_kept_on_a_terminal():
    assert terminal_text(ACTOR_LINE, colours=True) == ACTOR_LINE
    assert terminal_text(ACTOR_LINE, colours=False) == \
        "(ClientAppActor pid=10593) computing scattering features for 4000 images\n"


def test_a_command_without_out_leaves_no_log_behind(tmp_path):
    """A command writing one ``--out`` file keeps its log beside it; without ``--out`` the log is
    a temporary file, gone when the command ends (also when it fails)."""
    for failing in (False, True):
        with contextlib.suppress(RuntimeError), command_log("python -m simulations.classic", None) as path, \
                terminal(), console(path):
            log(INFO, "round 1/5")
            assert "round 1/5" in path.read_text()
            if failing:
                raise RuntimeError("a failed run")
        assert not path.exists()
    with command_log("python -m simulations.classic", tmp_path / "r.json") as path, terminal(), console(path):
        log(INFO, "round 1/5")
    assert path == tmp_path / "r.log" and "round 1/5" in path.read_text()
