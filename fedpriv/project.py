"""Where the project lives and its Flower app's run-config defaults: what the commands share
that imports nothing of them (so ``simulations._cli``, ``_federated`` and ``_ray`` form no
import circle, and ``fedpriv.new`` writes an app's defaults without the simulations)."""

import functools
import tomllib
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
"""The folder holding pyproject.toml (the Flower app's directory)."""


@functools.cache
def run_config_defaults() -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of pyproject.toml: the defaults of the federated flags."""
    with (PROJECT_ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)["tool"]["flwr"]["app"]["config"]
