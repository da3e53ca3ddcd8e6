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

from simulations._logging import console, terminal_text

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
