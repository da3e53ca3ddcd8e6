"""Numbers read from environment variables (a GPU share, a time limit, a scale): one parser,
so each gets the same rule for unset, malformed and out-of-range values."""

from __future__ import annotations

import os
from collections.abc import Callable


def number_from_env(name: str, default: float, valid: Callable[[float], bool], rule: str) -> float:
    """``$name`` as a float, ``default`` when unset; ``ValueError`` ("$name must be ``rule``,
    got '…'") when it is not a number or not ``valid`` (NaN never is)."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or not valid(value):
        raise ValueError(f"${name} must be {rule}, got {text!r}")
    return value
