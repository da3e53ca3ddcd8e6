"""The command-line parser every fedpriv command uses: a bad argument is one line, exit 2."""

from __future__ import annotations

import argparse
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
