"""``python -m simulations.mnist`` / ``simulations.cifar``: the flags are checked by
``simulations._cli`` (nothing heavy imported), then ``simulations._federated`` (torch,
Flower, Ray) runs. Kept apart from both so that neither imports the other's importer."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from simulations._cli import Parser, federated_parser, use_cache_dir


def run_federated(dataset: str, argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m simulations.<dataset>``: a bad flag stops here, before torch, Flower and
    Ray are imported; the cache folder is set before any of them is."""
    parser = federated_parser(dataset)
    use_cache_dir(parser, parser.parse_args(argv).cache_dir)
    from simulations._federated import main

    return main(dataset, argv)


def entry_point(dataset: str) -> tuple[Callable[[], Parser], Callable[..., dict[str, Any]]]:
    """``(build_parser, main)`` of ``simulations.<dataset>``."""
    return functools.partial(federated_parser, dataset), functools.partial(run_federated, dataset)
