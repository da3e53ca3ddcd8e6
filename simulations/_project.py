"""Where the project lives: the one constant the simulation modules share that imports nothing
of them (so ``_cli``, ``_federated`` and ``_ray`` form no import circle)."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
"""The folder holding pyproject.toml (the Flower app's directory)."""
