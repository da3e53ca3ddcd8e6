"""Benchmark: time to compute ε of 10,000 DP-SGD steps with a fresh RDP accountant.

``python -m benchmarks.accountant [--out FILE] [--repeats N]`` prints one JSON object
(median and all runs in ms; goal < 50 ms) and optionally writes it to FILE.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from fedpriv.privacy import dpsgd_event, make_accountant
from fedpriv.privacy.accountants.rdp import ORDERS, step_rdp
from simulations._cli import Parser, at_least

SIGMA, SAMPLE_RATE, STEPS, DELTA, GOAL_MS = 4.0, 0.01, 10_000, 1e-5, 50.0


def run(repeats: int) -> dict[str, object]:
    """Median wall time of fresh-accountant compose + epsilon over ``repeats`` runs,
    each with a cold curve cache (``cached_ms``: the same query with the curve cached)."""
    event = dpsgd_event(SIGMA, SAMPLE_RATE, STEPS)
    runs_ms, epsilon = [], 0.0
    for _ in range(repeats):
        step_rdp.cache_clear()
        start = time.perf_counter()
        epsilon = make_accountant("rdp").compose(event).epsilon(DELTA)
        runs_ms.append((time.perf_counter() - start) * 1e3)
    start = time.perf_counter()
    make_accountant("rdp").compose(event).epsilon(DELTA)
    cached_ms = (time.perf_counter() - start) * 1e3
    median = statistics.median(runs_ms)
    return {
        "benchmark": "rdp_epsilon_10k_steps",
        "noise_multiplier": SIGMA,
        "sample_rate": SAMPLE_RATE,
        "steps": STEPS,
        "delta": DELTA,
        "orders": len(ORDERS),
        "epsilon": epsilon,
        "median_ms": round(median, 2),
        "runs_ms": [round(t, 2) for t in runs_ms],
        "cached_ms": round(cached_ms, 3),
        "goal_ms": GOAL_MS,
        "meets_goal": median < GOAL_MS,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m benchmarks.accountant", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    parser.add_argument("--repeats", type=at_least(1), default=9, help="(default: 9)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    result = json.dumps(run(args.repeats))
    print(result)
    if args.out:
        args.out.write_text(result + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
