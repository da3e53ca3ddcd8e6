"""A federated run on the terminal: one log line per round (round r/R, test accuracy, the
largest client ε, seconds), which reads well in a piped log, and on a terminal a bar by
round kept under those lines."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from functools import partial
from logging import INFO
from types import TracebackType
from typing import Any, TextIO

from flwr.supercore import log
from flwr.supercore.logger import LOGGER_NAME
from tqdm import tqdm

from server.history import History, RoundLog, epsilon_text


class Progress:
    """The rounds on the console. Every round logs one line (round r/R, test accuracy, the
    largest client ε, seconds), which reads well in a piped log. When stderr is a terminal a
    bar by round also shows, kept under the log lines: while it is open, Flower's console
    handler and ``sys.stdout``/``sys.stderr`` (Ray prints its actors' output there) write
    whole lines above it instead of through it."""

    def __init__(self, rounds: int, done: int = 0) -> None:
        self.rounds = rounds
        self.bar = tqdm(total=rounds, initial=done, desc="rounds", unit="round", disable=None,
                        dynamic_ncols=True)
        self._start = time.perf_counter()
        self._restore: list[Callable[[], None]] = []

    def __enter__(self) -> Progress:
        if not self.bar.disable:
            self._redirect()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            for undo in reversed(self._restore):
                undo()
        finally:
            self._restore = []
            self.bar.close()

    def initial(self, history: History) -> None:
        """Log the initial model's test accuracy."""
        accuracy = history.initial.get("test_accuracy")
        if accuracy is not None:
            log(INFO, "round 0/%d: test accuracy %.2f %% (initial model)", self.rounds, 100 * accuracy)

    def start(self) -> None:
        """A round starts now."""
        self._start = time.perf_counter()

    def round_done(self, round_log: RoundLog) -> None:
        """Log the round's line and move the bar."""
        seconds = time.perf_counter() - self._start
        accuracy = round_log.test_accuracy
        if accuracy is None:  # evaluate_fn records it before the round is done
            raise RuntimeError(f"round {round_log.round} has no test accuracy")
        eps = max(round_log.epsilon.values(), default=math.nan)
        metrics = round_log.train_metrics
        count_only = f", count-only (S = {metrics['user_clip']:.3g})" if metrics.get("count_only") else ""
        log(INFO, "round %d/%d: test accuracy %.2f %%, max client ε %s, %.1f s%s",
            round_log.round, self.rounds, 100 * accuracy, epsilon_text(eps), seconds, count_only)
        self.bar.set_postfix_str(f"accuracy {100 * accuracy:.2f} %, max ε {epsilon_text(eps)}", refresh=False)
        self.bar.update(1)

    def _redirect(self) -> None:
        """Flower's console handlers and the standard streams write whole lines above the bar."""
        for handler in logging.getLogger(LOGGER_NAME).handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and stream is not None and stream in (sys.stdout, sys.stderr):
                above = _AboveBar(stream, self.bar)
                handler.setStream(above)
                self._restore.append(_then_finish(partial(handler.setStream, stream), above))
        for name in ("stdout", "stderr"):
            original = getattr(sys, name)
            above = _AboveBar(original, self.bar)
            setattr(sys, name, above)
            self._restore.append(_then_finish(partial(setattr, sys, name, original), above))


def _then_finish(undo: Callable[[], object], above: _AboveBar) -> Callable[[], None]:
    """``undo``, then write out what ``above`` still holds."""

    def restore() -> None:
        undo()
        above.finish()

    return restore


class _AboveBar:
    """A text stream that writes whole lines to ``stream`` with ``bar`` cleared, then redrawn
    (a partial line waits for its end, or for ``finish``); anything else is the stream's."""

    def __init__(self, stream: TextIO, bar: tqdm) -> None:
        self.stream = stream
        self.bar = bar
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            lines, _, self._pending = self._pending.rpartition("\n")
            self._emit(lines + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def finish(self) -> None:
        """Write the partial line left, if any, ended (the bar would draw over it)."""
        if self._pending:
            self._emit(self._pending + "\n")
            self._pending = ""

    def _emit(self, text: str) -> None:
        with tqdm.external_write_mode(file=self.bar.fp):
            self.stream.write(text)
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
