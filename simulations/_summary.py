"""What the one-result commands (``simulations.classic``, ``dppca``, ``dpdropout``) print: a
few lines a reader can judge at a glance (the metric beside its references, each client's
ε and δ), then the result's JSON: written to ``--out`` (the terminal gets the file's name)
or, without ``--out``, printed as the last line (``| tail -n 1`` gives it to a program).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from simulations._cli import write_out


def metric_text(name: str, value: float | None) -> str:
    """A metric as a reader reads it: accuracies in %, errors to 4 significant digits."""
    if value is None:
        return "n/a"
    return f"{100 * value:.2f} %" if "accuracy" in name else f"{value:.4g}"


def epsilon_line(client_epsilon: Mapping[str, float], delta: float, source: str) -> str:
    """``ε per client (source, δ = 1e-05): 0: 2.0000, 1: 2.0000`` (summarised past ``MANY_CLIENTS``)."""
    from server.history import MANY_CLIENTS, by_client, epsilon_summary, epsilon_text

    if len(client_epsilon) > MANY_CLIENTS:
        listed = epsilon_summary(client_epsilon.values())
    else:
        listed = ", ".join(f"{client}: {epsilon_text(float(eps))}"
                           for client, eps in by_client(dict(client_epsilon)).items())
    return f"ε per client ({source}, δ = {delta:g}): {listed}"


def report(lines: list[str], result: Mapping[str, Any], out: Path | None, log: Path | None = None) -> None:
    """Print ``lines``, then the JSON of ``result``: to ``out`` (named on a last line), else
    printed as one line; ``log``, where it was written, is named too."""
    text = json.dumps(result)
    write_out(out, json.dumps(result, indent=2))
    if log is not None and log.exists():
        lines = [*lines, f"log: {log}"]
    print("\n".join([*lines, f"written: {out}" if out is not None else text]), flush=True)


@contextlib.contextmanager
def flower_console(federated: bool, log: Path) -> Iterator[Path | None]:
    """``simulations._logging.console(log)`` around a run in Flower's simulation engine; nothing else."""
    if not federated:
        yield None
        return
    from simulations._logging import console

    with console(log) as path:
        yield path
