"""Every ``python -m ...`` command of README.md's "Running things" table parses as written:
its module's ``build_parser()`` takes the command's arguments (a flag the README names
that does not exist fails), for the federated simulations the fused run config passes
``RunSettings`` and the training plan, as it would before ``simulate``, and a command that
reads a data set says where from (``--data-dir``, which must hold it, or ``--download``).
Nothing is run."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from fedpriv.data import check_available

ROOT = Path(__file__).resolve().parents[1]
FEDERATED = {"simulations.mnist": "mnist", "simulations.cifar": "cifar10"}
READS_DATA = {**FEDERATED, "simulations.centralized": None, "benchmarks.simulation": "mnist"}  # None: --dataset


def running_things_commands() -> list[str]:
    """The ``python -m ...`` code spans of the table under "## Running things"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Running things\n", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [span for row in rows for span in re.findall(r"`(python -m [^`]+)`", row)]


COMMANDS = running_things_commands()


def test_the_table_has_the_commands() -> None:
    modules = {shlex.split(command)[2] for command in COMMANDS}
    assert {"simulations.mnist", "simulations.cifar", "simulations.centralized", "benchmarks.dpsgd",
            "benchmarks.accountant", "benchmarks.simulation"} <= modules


@pytest.mark.parametrize("command", COMMANDS)
def test_command_parses(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    python, dash_m, module, *argv = shlex.split(command)
    assert (python, dash_m) == ("python", "-m")
    found = importlib.import_module(module)
    if not hasattr(found, "build_parser"):  # a package run by its __main__ (python -m fedpriv.privacy)
        found = importlib.import_module(f"{module}.__main__")
    parser = found.build_parser()
    try:
        args = parser.parse_args(argv)
        if module in FEDERATED:
            from flwr.common.config import get_fused_config_from_dir

            from fedpriv.project import PROJECT_ROOT
            from simulations._run_config import check_settings, run_config_overrides

            overrides = run_config_overrides(args, FEDERATED[module])
            check_settings(parser, get_fused_config_from_dir(PROJECT_ROOT, overrides))
    except SystemExit:
        pytest.fail(f"README command does not parse: {command}\n{capsys.readouterr().err}")
    if module in READS_DATA:
        download = getattr(args, "download", None)
        assert args.data_dir or download, f"neither --data-dir nor --download: {command}"
        if not download:  # run from the project root, as the README's commands are
            check_available(READS_DATA[module] or args.dataset, ROOT / args.data_dir)
