"""Federated DP-SGD on MNIST: ``python -m simulations.mnist --clients 10 --target-epsilon 2``.

Runs the project's ClientApp and ServerApp with Flower's Ray simulation engine; see
``python -m simulations.mnist --help`` and docs/federated.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from simulations._cli import federated_parser, use_cache_dir

DATASET = "mnist"


def build_parser() -> argparse.ArgumentParser:
    return federated_parser(DATASET)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    # A bad flag stops here, before torch, Flower and Ray are imported; the cache folder
    # is set before any of them is.
    parser = build_parser()
    use_cache_dir(parser, parser.parse_args(argv).cache_dir)
    from simulations._federated import main as simulate_main

    return simulate_main(DATASET, argv)


if __name__ == "__main__":
    main()
