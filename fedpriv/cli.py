"""The command-line parser every fedpriv command uses: a bad argument is one line, exit 2."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose error is one line on stderr (``prog: error: message``,
    exit status 2), without the usage block: ``--help`` has that. Flags are never
    abbreviated, so a misspelt flag is an error rather than another flag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def number(name: str, valid: Callable[[float], bool], rule: str) -> Callable[[str], float]:
    """An argparse type: a finite float for which ``valid`` holds, or one line naming ``name``
    and ``rule``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not (math.isfinite(value) and valid(value)):
            raise argparse.ArgumentTypeError(f"{name} must be {rule}, got {text}")
        return value

    return parse


def count(name: str, minimum: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``, or one line naming ``name``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be >= {minimum}, got {text}")
        return value

    return parse
