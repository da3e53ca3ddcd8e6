"""What every ``python -m simulations.*`` / ``benchmarks.*`` command shares on its command
line: typed argparse converters, a parser whose errors are one line, ``--cache-dir``, and
the flags of the federated commands (``simulations.mnist`` / ``simulations.cifar``).

Nothing here imports torch, flwr or the data sets, so a bad flag is reported at once,
before any of them (or Ray) is started.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedpriv.cli import Parser
from fedpriv.federation import modes
from fedpriv.federation.keys import Key
from fedpriv.federation.settings import EXCLUSIVE, KEYS, USER_LEVEL_KEYS, used_by

CACHE_ENV = "FEDPRIV_CACHE_DIR"
CACHE_HELP = ("cache of data-independent features (default: $FEDPRIV_CACHE_DIR or ~/.cache/fedpriv; "
              "'off' disables it)")


def _number(kind: type, text: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text}")
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """An integer >= ``minimum``."""
    def parse(text: str) -> int:
        value = _number(int, text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value

    return parse


def even_or_zero(text: str) -> int:
    """An even integer >= 0 (SecAgg+'s neighbours per node, 0: all)."""
    value = at_least(0)(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"must be even, got {text}")
    return value


def positive(text: str) -> float:
    """A finite number > 0."""
    value = _number(float, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative(text: str) -> float:
    """A finite number >= 0."""
    value = _number(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def probability(text: str) -> float:
    """A number in (0, 1]: a fraction of clients that must not be empty."""
    value = _number(float, text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def unit_interval(text: str) -> float:
    """A number in [0, 1]."""
    value = _number(float, text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def delta(text: str) -> float:
    """δ of a guarantee: in (0, 1)."""
    value = _number(float, text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value


def write_out(out: Path | None, text: str) -> None:
    """Write a command's result ``text`` to ``--out`` (its folder made first), if given."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def report_json(parser: argparse.ArgumentParser, out: Path | None, compute: Callable[[], dict[str, Any]]
                ) -> dict[str, Any]:
    """Run a command's ``compute`` once its inputs are checked: a data set that fails to load
    or a value out of range found on the way (a corrupted file, a target ε out of reach) is
    one ``parser.error`` line; the result is printed as JSON and written to ``out``."""
    from fedpriv.data import DatasetNotFoundError

    try:
        result = compute()
    except (DatasetNotFoundError, ValueError) as err:
        parser.error(str(err))
    text = json.dumps(result, indent=2)
    write_out(out, text)
    print(text)
    return result


def add_cache_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", metavar="DIR", help=CACHE_HELP)


def use_cache_dir(parser: argparse.ArgumentParser, cache_dir: str | None) -> None:
    """Point ``$FEDPRIV_CACHE_DIR`` at ``--cache-dir`` (absolute) for this process and the
    ones it starts (Ray workers inherit the environment); nothing without the flag."""
    if cache_dir is None:
        return
    if cache_dir.strip().lower() == "off":  # fedpriv.cache's word for "no cache"
        os.environ[CACHE_ENV] = "off"
        return
    path = Path(cache_dir).expanduser().resolve()
    if path.exists() and not path.is_dir():
        parser.error(f"argument --cache-dir: not a folder: {path}")
    os.environ[CACHE_ENV] = str(path)


def flag_message(message: str, flags: Mapping[str, str]) -> str:
    """A run-config (or plan) error in the command's words: ``rounds must be >= 1`` becomes
    ``argument --rounds: must be >= 1``, and ``resume needs state-dir`` becomes
    ``--resume needs --state-dir``. ``flags`` maps kebab-case keys to their flags."""
    def flag(key: str) -> str | None:
        return flags.get(key.replace("_", "-"))

    head = re.match(r"([a-z][a-z_-]*)(?::| (?=must ))\s*(.*)", message, re.S)
    if head and flag(head.group(1)):
        return f"argument {flag(head.group(1))}: {head.group(2)}"
    return re.sub(r"(?<![\w-])[a-z][a-z_-]*(?![\w-])", lambda m: flag(m.group()) or m.group(), message)


LOG_FILE = "run.log"
"""In a federated run's ``--out``: every Flower record of the run, and the notices kept off the terminal."""
OUT_FILES = ("results.json", "ledger.json", "accuracy.png", "epsilon.png", LOG_FILE)
"""What a federated run writes to ``--out``."""


def check_out(parser: argparse.ArgumentParser, out: Path, resume: bool) -> None:
    """``--out`` must not hold an earlier run's results (they would be mixed with this one's):
    one ``parser.error`` line naming them. ``--resume`` continues into any folder."""
    held = sorted(name for name in OUT_FILES if (out / name).exists())
    if held and not resume:
        parser.error(f"argument --out: {out} already holds a run's results ({', '.join(held)}): "
                     "choose another --out, or remove them")


def check_data_dir(parser: argparse.ArgumentParser, data_dir: str | None, download: bool) -> None:
    """A ``--data-dir`` that is no folder is refused at once, before the data sets' modules
    (and torch) are imported; whether it holds the data set is checked after them."""
    if data_dir is None or download:
        return
    path = Path(data_dir).expanduser().resolve()
    if not path.is_dir():
        parser.error(f"argument --data-dir: no such folder: {path} (the folder that holds the data set; "
                     "--download fetches it there)")



def _flag_type(key: Key) -> Callable[[str], Any]:
    """The argparse type of a number key's flag: its kind, finite, in its bound."""
    def parse(text: str) -> Any:
        value = _number(key.kind, text)
        if key.bound is not None and not key.bound.holds(value):
            raise argparse.ArgumentTypeError(f"must be {key.bound.text}, got {text}")
        return value

    return parse


def add_flag(parser: argparse.ArgumentParser | argparse._ActionsContainer, key: Key,
             shown: str | None = None) -> None:
    """``--<key>`` as its definition says (``fedpriv.federation.keys``); unset (None), it
    keeps the run config's default, which its help shows (or ``shown``)."""
    if shown is None:
        shown = key.unset if key.default is None else \
            ("yes" if key.default else "no") if key.kind is bool else str(key.default)
    used = used_by(key.name)
    only = "" if used == frozenset(modes.MODES) else f"[only {modes.described(used)}] "
    options: dict[str, Any] = {"help": f"{only}{key.help} (default: {shown})", "default": None}
    if key.kind is bool:
        options["action"] = argparse.BooleanOptionalAction if key.default else "store_true"
    elif key.choices is not None:
        options["choices"] = key.choices
    elif key.kind in (int, float):
        options["type"] = _flag_type(key)
    if key.metavar:
        options["metavar"] = key.metavar
    parser.add_argument(f"--{key.name}", **options)


def add_max_physical_batch(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, KEYS["max-physical-batch"])


FLAG_KEYS = tuple(key for key in KEYS.values() if key.flag)
"""The run-config keys that are flags of the federated commands (``--<key>``)."""
FLAGS = {key.name: f"--{key.name}" for key in FLAG_KEYS} | {"min-clients": "--clients"}
"""Run-config key -> the flag that sets it, for error messages."""


USER_LEVEL_FLAGS = tuple(key.name for key in FLAG_KEYS if key.name in USER_LEVEL_KEYS)
"""The user-level keys that are flags (``--<key>``)."""


def add_user_level(parser: argparse.ArgumentParser) -> None:
    """The user-level flags (``--privacy user``, docs/user-level.md)."""
    user = parser.add_argument_group("user level (--privacy user)")
    for name in USER_LEVEL_FLAGS:
        add_flag(user, KEYS[name])


def federated_parser(dataset: str) -> Parser:
    """The flags of ``python -m simulations.<dataset>``: one per run-config key the command
    does not set itself, as ``fedpriv.federation.settings`` defines it; an unset flag keeps
    pyproject's default."""
    p = Parser(
        prog=f"python -m simulations.{'cifar' if dataset == 'cifar10' else dataset}",
        description=f"Federated DP-SGD on {dataset} with Flower's Ray simulation engine. Unset flags "
                    "keep the run defaults of pyproject.toml's [tool.flwr.app.config].",
    )
    p.add_argument("--clients", type=at_least(1), default=10, help="simulated SuperNodes (default: 10)")
    noise = p.add_mutually_exclusive_group()
    for key in FLAG_KEYS:
        if key.name not in USER_LEVEL_KEYS:
            add_flag(noise if key.name in EXCLUSIVE else p, key, f"runs/{dataset}" if key.name == "out" else None)
    p.set_defaults(out=f"runs/{dataset}")
    add_user_level(p)
    p.add_argument("--num-examples-noise", type=positive,
                   help="nodes release N as a Gaussian count of this std (default: N is public)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the planner's plan for these flags (python -m fedpriv.privacy plan) and exit")
    p.add_argument("--ray-address", help="join this Ray cluster instead of starting one")
    p.add_argument("--cpus-per-client", type=positive,
                   help="default: torch's threads shared out, max(1, threads // clients)")
    p.add_argument("--gpus-per-client", type=non_negative,
                   help="default with CUDA: the share of the GPU a client's measured DP-SGD step needs; else 0")
    add_cache_dir(p)
    return p
