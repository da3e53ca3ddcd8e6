"""Federated DP-SGD on CIFAR-10: ``python -m simulations.cifar --clients 10 --target-epsilon 8``.

Same flags as ``simulations.mnist``; pass ``--download`` the first time (or ``--data-dir``).
"""

from __future__ import annotations

import argparse
from typing import Any

from simulations._cli import federated_parser, use_cache_dir

DATASET = "cifar10"


def build_parser() -> argparse.ArgumentParser:
    return federated_parser(DATASET)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    # A bad flag stops here, before torch, Flower and Ray are imported (see simulations.mnist).
    parser = build_parser()
    use_cache_dir(parser, parser.parse_args(argv).cache_dir)
    from simulations._federated import main as simulate_main

    return simulate_main(DATASET, argv)


if __name__ == "__main__":
    main()
