"""Benchmark: the server's per-round booking of a user-level population in its durable ledger.

``python -m benchmarks.ledger [--clients N] [--rounds R] [--profile ROUND ...] [--out FILE]``
books R rounds of ``user_round_event(q, z)`` for each of N clients into a ``ServerLedger``
with a state file, one transaction per round (as ``server.userlevel`` does), and prints
one JSON object: the wall time of every round in ms. ``--profile`` prints a cProfile of
the given rounds (cumulative time, top 25) to stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

from fedpriv.privacy import Budget
from fedpriv.privacy.userlevel import user_round_event
from server.ledger import ServerLedger
from simulations._cli import Parser, at_least

SAMPLE_RATE, NOISE_MULTIPLIER, BUDGET = 0.1, 1.09, Budget(epsilon=50.0, delta=1e-5)


def book_round(ledger: ServerLedger, clients: list[str], server_round: int) -> int:
    """Book ``server_round`` for every client in one transaction; the number booked."""
    event = user_round_event(SAMPLE_RATE, NOISE_MULTIPLIER)
    booked = 0
    with ledger.transaction() as book:
        for cid in clients:
            booked += book.record(cid, f"bench/round-{server_round}/train", (event,))
    return booked


def run(clients: int, rounds: int, profile: set[int]) -> dict[str, object]:
    """Per-round wall time (ms) of booking ``clients`` clients for ``rounds`` rounds."""
    ids = [str(i) for i in range(clients)]
    round_ms: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        ledger = ServerLedger(BUDGET, Path(folder) / "ledger.json")
        for r in range(1, rounds + 1):
            profiler = cProfile.Profile() if r in profile else None
            start = time.perf_counter()
            if profiler:
                profiler.enable()
            booked = book_round(ledger, ids, r)
            if profiler:
                profiler.disable()
            round_ms.append((time.perf_counter() - start) * 1e3)
            if booked != clients:
                raise RuntimeError(f"round {r}: booked {booked} of {clients} clients")
            if profiler:
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
                print(f"--- round {r} ---\n{text.getvalue()}", file=sys.stderr)
        size = (Path(folder) / "ledger.json").stat().st_size
        epsilon = ledger.snapshot().spent(ids[0])
    return {
        "benchmark": "server_ledger_booking",
        "clients": clients,
        "rounds": rounds,
        "sample_rate": SAMPLE_RATE,
        "noise_multiplier": NOISE_MULTIPLIER,
        "epsilon_after": epsilon,
        "ledger_bytes": size,
        "round_ms": [round(t, 1) for t in round_ms],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m benchmarks.ledger", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=at_least(1), default=1000, help="(default: 1000)")
    parser.add_argument("--rounds", type=at_least(1), default=60, help="(default: 60)")
    parser.add_argument("--profile", type=at_least(1), nargs="*", default=[], help="rounds to profile")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    result = json.dumps(run(args.clients, args.rounds, set(args.profile)))
    print(result)
    if args.out:
        args.out.write_text(result + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
