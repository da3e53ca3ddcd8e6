"""``python -m simulations.mnist`` / ``simulations.cifar``: the flags and the cheap checks
(``--out``, ``--data-dir``) in ``simulations._cli``, nothing heavy imported, so a mistake
there is one line within a second or two; then ``simulations._federated`` (torch, Flower,
Ray) runs. Kept apart from both so that neither imports the other's importer."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedpriv.federation import modes
from fedpriv.federation.settings import KEYS, USED_BY, used_by
from simulations._cli import Parser, check_data_dir, check_out, federated_parser, use_cache_dir


def check_mode_flags(parser: Parser, args: argparse.Namespace, defaults: Mapping[str, Any] | None = None) -> None:
    """Refuse (one line, exit 2) a flag that the chosen privacy mode does not use
    (``fedpriv.federation.settings.USED_BY``), rather than ignore it. The mode is the flags',
    else ``defaults``' (a user's app's run config; the definitions' defaults without one)."""
    def chosen(key: str) -> str:
        return getattr(args, KEYS[key].attr) or (defaults or {}).get(key) or KEYS[key].default

    mode = modes.mode_of(chosen("privacy"), chosen("user-noise"))
    for key in USED_BY:
        if mode not in used_by(key) and getattr(args, KEYS[key].attr, None) is not None:
            flag = "--no-accept-failures" if key == "accept-failures" and not args.accept_failures else f"--{key}"
            parser.error(f"argument {flag}: {modes.unused_reason(mode, used_by(key))}")


def run_federated(dataset: str, argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m simulations.<dataset>``: a bad flag, an ``--out`` holding results (but for
    ``--dry-run``, which writes none) and a ``--data-dir`` that is no folder stop here, before
    torch, Flower and Ray are imported; the cache folder is set before any of them is."""
    parser = federated_parser(dataset)
    check_args(parser, parser.parse_args(argv))
    from simulations._federated import main

    return main(dataset, argv)


def check_args(parser: Parser, args: argparse.Namespace, defaults: Mapping[str, Any] | None = None) -> None:
    """The federated commands' cheap checks, before torch, Flower and Ray are imported: flags
    the mode does not use (the mode of the flags, else of ``defaults``: a user's app's run
    config), the cache folder, an ``--out`` holding results (but for ``--dry-run``, which
    writes none), a ``--data-dir`` that is no folder."""
    check_mode_flags(parser, args, defaults)
    use_cache_dir(parser, args.cache_dir)
    if not args.dry_run:
        check_out(parser, Path(args.out).resolve(), bool(args.resume))
    check_data_dir(parser, args.data_dir, bool(args.download))


def entry_point(dataset: str) -> tuple[Callable[[], Parser], Callable[..., dict[str, Any]]]:
    """``(build_parser, main)`` of ``simulations.<dataset>``."""
    return functools.partial(federated_parser, dataset), functools.partial(run_federated, dataset)
