"""Federated DP of your own app: ``python -m simulations.run --app APP_DIR --clients K``.

``APP_DIR`` is a Flower app of a user's task (``python -m fedpriv new``; docs/own-task.md):
its ``pyproject.toml`` names fedpriv's ServerApp and ClientApp and the run-config key
``task``. The command is ``simulations.mnist``'s (``simulations._federated``: the same
flags, checks, progress, plots and ``results.json``), run on the app's folder: its run
config under the flags, its task imported by name from its folder (on ``sys.path``, as
Flower puts it), checked whole before anything starts (``fedpriv.task.check_task``: a
broken task is one line, exit 2). The simulated nodes read the app's ``data/`` unless
``--data-dir`` names another folder: that is their policy's, as their operator.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

from simulations._cli import Parser, federated_parser
from simulations._command import check_args

PROG = "python -m simulations.run"


def build_parser() -> Parser:
    """``simulations.mnist``'s flags, and ``--app``."""
    parser = federated_parser("app")
    parser.prog = PROG
    parser.description = ("Federated DP-SGD on your own app's task (python -m fedpriv new) with Flower's Ray "
                          "simulation engine. Unset flags keep the app's pyproject.toml [tool.flwr.app.config].")
    parser.add_argument("--app", required=True, type=Path, metavar="APP_DIR",
                        help="the app's folder: pyproject.toml with task = \"<module>\" (python -m fedpriv new)")
    return parser


def app_folder(parser: Parser, app: Path) -> tuple[Path, dict[str, Any]]:
    """``app`` resolved and its run config, if its pyproject.toml names a task; else ``parser.error``."""
    app = app.expanduser().resolve()
    try:
        with (app / "pyproject.toml").open("rb") as file:
            config = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as err:
        parser.error(f"argument --app: {app} holds no Flower app with a run config ({type(err).__name__}: {err})")
    if not config.get("task"):
        parser.error(f"argument --app: {app}/pyproject.toml sets no task in [tool.flwr.app.config] "
                     "(task = \"task\" for task.py)")
    return app, config


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Check the flags and the app, then run ``simulations._federated`` on it."""
    parser = build_parser()
    app, config = app_folder(parser, parser.parse_args(argv).app)
    parser.set_defaults(data_dir=str(app / "data"), out=f"runs/{app.name}")
    check_args(parser, parser.parse_args(argv), config)  # with the app's folders and privacy mode as defaults
    sys.path.insert(0, str(app))  # the task imports by name, here and in Ray's workers (their PYTHONPATH)
    from simulations._federated import main as simulate_app

    return simulate_app(None, argv, parser=parser, app_dir=app)


if __name__ == "__main__":
    main()
