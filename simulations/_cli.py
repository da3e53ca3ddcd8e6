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
from fedpriv.project import run_config_defaults

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


def add_max_physical_batch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-physical-batch", type=at_least(1), metavar="N",
                        help="examples per micro-batch of a lot: memory and speed, never privacy "
                             "(default: the most that fit the device's memory, from a measured step)")


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



def add_user_level(parser: argparse.ArgumentParser) -> None:
    """The user-level flags (``--privacy user``, docs/user-level.md); unset, each keeps
    pyproject's default."""
    d = run_config_defaults()
    user = parser.add_argument_group("user level (--privacy user)")
    user.add_argument("--cohort", type=at_least(1), help="expected clients per round, Poisson-sampled (default: all)")
    user.add_argument("--user-clip", type=positive, help=f"S, the bound on each client's model delta "
                                                         f"(default: {d['user-clip']})")
    user.add_argument("--user-noise", choices=["central", "distributed"],
                      help="central: the server adds the noise (trusted to); distributed: each sampled client adds a "
                           "discrete Gaussian share under secure aggregation, the server sees only the noisy sum "
                           f"(default: {d['user-noise']})")
    user.add_argument("--clip-quantile", type=unit_interval,
                      help="adaptive clipping: S follows this quantile of the update norms (default: fixed S)")
    user.add_argument("--clip-lr", type=positive, help=f"adaptive clipping's step η (default: {d['clip-lr']})")
    user.add_argument("--clip-count-noise", type=positive,
                      help="σ_b of adaptive clipping's noisy count (default: max(cohort / 20, z))")
    user.add_argument("--clip-warmup-rounds", type=at_least(0), metavar="W",
                      help="adaptive clipping: the first W rounds release only the noisy count, placing S before the "
                           f"model moves (default: {d['clip-warmup-rounds']})")
    user.add_argument("--clip-warmup-lr", type=positive,
                      help=f"η of S's update in those count-only rounds (default: {d['clip-warmup-lr']})")


def federated_parser(dataset: str) -> Parser:
    """The flags of ``python -m simulations.<dataset>``; an unset flag keeps pyproject's default."""
    d = run_config_defaults()
    plan = "default: the data set's plan"
    p = Parser(
        prog=f"python -m simulations.{'cifar' if dataset == 'cifar10' else dataset}",
        description=f"Federated DP-SGD on {dataset} with Flower's Ray simulation engine. Unset flags "
                    "keep the run defaults of pyproject.toml's [tool.flwr.app.config].",
    )
    p.add_argument("--clients", type=at_least(1), default=10, help="simulated SuperNodes (default: 10)")
    p.add_argument("--rounds", type=at_least(1), help=f"federated rounds (default: {d['rounds']})")
    p.add_argument("--local-epochs", type=at_least(1),
                   help=f"local epochs per round (default: {d['local-epochs']})")
    noise = p.add_mutually_exclusive_group()
    noise.add_argument("--target-epsilon", type=positive,
                       help="calibrate each client's σ to end at ≤ ε (default: none, a fixed σ)")
    noise.add_argument("--noise-multiplier", type=non_negative,
                       help=f"fixed σ for every client, 0 for no noise ({plan})")
    p.add_argument("--delta", type=delta, help=f"δ of every guarantee (default: {d['delta']})")
    p.add_argument("--epsilon-budget", type=positive,
                   help="per-client ε budget of the server ledger (default: --target-epsilon, else unlimited)")
    p.add_argument("--client-epsilon-budget", type=positive,
                   help="ε budget in each simulated node's policy (default: --epsilon-budget, else "
                        "--target-epsilon, else unlimited)")
    p.add_argument("--num-examples-noise", type=positive,
                   help="nodes release N as a Gaussian count of this std (default: N is public)")
    p.add_argument("--lot-size", type=at_least(1), help=f"expected Poisson lot size ({plan})")
    p.add_argument("--max-grad-norm", type=positive, help=f"clipping norm C ({plan})")
    p.add_argument("--lr", type=positive, help=f"learning rate ({plan})")
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], help=plan)
    add_max_physical_batch(p)
    p.add_argument("--model", metavar="NAME", help=f"a fedpriv.models name ({plan})")
    p.add_argument("--fraction-train", type=probability,
                   help=f"fraction of clients sampled per round (default: {d['fraction-train']})")
    p.add_argument("--fraction-evaluate", type=unit_interval,
                   help="fraction of clients asked for a noisy, booked evaluation per round "
                        f"(default: {d['fraction-evaluate']})")
    p.add_argument("--partition", choices=["iid", "dirichlet", "shard"],
                   help=f"how the training set is split (default: {d['partition']})")
    p.add_argument("--alpha", type=positive, help=f"Dirichlet concentration (default: {d['alpha']})")
    p.add_argument("--seed", type=int, help="seeds the server's sampling and model init, and the simulated "
                                            f"nodes' randomness and partition key (default: {d['seed']})")
    p.add_argument("--limit-train", type=at_least(1), help="use the first N training examples (default: all)")
    p.add_argument("--limit-test", type=at_least(1), help="use the first N test examples (default: all)")
    p.add_argument("--data-dir", help="root folder of the data sets (default: $XDG_CACHE_HOME/fedpriv "
                                      "or ~/.cache/fedpriv)")
    p.add_argument("--download", action="store_true", default=None,
                   help="download the data set if it is missing (default: no)")
    p.add_argument("--out", default=f"runs/{dataset}",
                   help="output folder; one holding a run's results is refused unless --resume "
                        f"(default: runs/{dataset})")
    p.add_argument("--state-dir", help="keep the server's ledger and checkpoints here and each node's "
                                       "ledger under nodes/ (default: a temporary folder)")
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue the run in --state-dir from its last completed round")
    p.add_argument("--accept-failures", action=argparse.BooleanOptionalAction, default=None,
                   help="aggregate a round although a sampled client refused, failed or timed out; "
                        "--no-accept-failures keeps the previous model then "
                        f"(default: {'yes' if d['accept-failures'] else 'no'})")
    p.add_argument("--privacy", choices=["local", "distributed", "user"],
                   help="local: each node's DP-SGD noises its update; distributed: nodes add integer noise "
                        "shares under secure aggregation and the server sees only the noisy sum; user: "
                        f"user-level DP-FedAvg (default: {d['privacy']})")
    p.add_argument("--lattice-rounding", choices=["nearest", "conditional"],
                   help="distributed mode: each clipped example to the nearest lattice point, or by Kairouz et al.'s "
                        f"conditional randomized rounding (default: {d['lattice-rounding']})")
    p.add_argument("--secagg-neighbours", type=even_or_zero, metavar="K",
                   help="distributed mode: SecAgg+ on a random graph where each node masks with and shares its "
                        "secrets among only K others (even; every simulated node's policy accepts K), 0 for "
                        f"all others (default: {d['secagg-neighbours']})")
    add_user_level(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print the planner's plan for these flags (python -m fedpriv.privacy plan) and exit")
    p.add_argument("--ray-address", help="join this Ray cluster instead of starting one")
    p.add_argument("--cpus-per-client", type=positive,
                   help="default: torch's threads shared out, max(1, threads // clients)")
    p.add_argument("--gpus-per-client", type=non_negative,
                   help="default with CUDA: the share of the GPU a client's measured DP-SGD step needs; else 0")
    add_cache_dir(p)
    return p
