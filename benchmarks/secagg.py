"""Benchmark: the cost of one secure sum (``fedpriv.secagg``, pure protocol, in-process).

``python -m benchmarks.secagg [--nodes 10 100] [--neighbours 0 20] [--dimension 39700]
[--out FILE]`` prints one JSON object per cohort size and SecAgg+ neighbours per node (0: the
full graph): the round's wall time on this machine (every node and the server in one
process, one after another), the server's share of it, a node's mean time, and the bytes
each node sent and received (payload of the stage configs). Every node has an identity of
one consortium CA and checks its peers' (as distributed nodes do by default), made before
the clock starts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedpriv.certificates import write_consortium
from fedpriv.secagg import NodeState, Requirements, SecureAggregation, StageInfo, Vector, answer, graph
from fedpriv.secagg.identity import load_identity
from simulations._cli import Parser, at_least, even_or_zero


def constant(vector: np.ndarray) -> Callable[[StageInfo], Vector]:
    return lambda info: Vector(vector, {})


def run(n: int, dimension: int, neighbours: int = 0, bits: int = 32) -> dict[str, object]:
    """One round with ``n`` nodes, each with ``neighbours`` (0: all others), at the distributed
    mode's threshold, every node surviving."""
    nodes = list(range(1, n + 1))
    rng = np.random.default_rng(0)
    inputs = {u: rng.integers(0, 1 << bits, dimension, dtype=np.uint64) for u in nodes}
    with tempfile.TemporaryDirectory(prefix="fedpriv-consortium-") as folder:
        ca = write_consortium(Path(folder), [str(u) for u in nodes])
        reqs = {u: Requirements(min_cohort=2, min_survivors=2, max_colluders=0, min_neighbours=neighbours or None,
                                identity=load_identity(ca, Path(folder) / str(u))) for u in nodes}
    states = {u: NodeState() for u in nodes}
    node_s = dict.fromkeys(nodes, 0.0)
    start = time.perf_counter()
    agg = SecureAggregation(nodes, dimension=dimension, modulus_bits=bits, threshold=graph.threshold(n, neighbours),
                            round_key="bench", neighbours=neighbours)
    while not agg.done:
        replies = {}
        for u, config in agg.requests().items():
            t0 = time.perf_counter()
            replies[u] = answer(states[u], reqs[u], u, config, constant(inputs[u]))
            node_s[u] += time.perf_counter() - t0
        agg.receive(replies)
    result = agg.result()
    wall = time.perf_counter() - start
    expected = sum(inputs.values()) % (1 << bits)
    assert result.sum is not None and np.array_equal(result.sum, expected)
    return {"nodes": n, "neighbours": neighbours, "dimension": dimension, "threshold": agg.threshold,
            "round_seconds": round(wall, 2),
            "server_seconds": round(wall - sum(node_s.values()), 2),
            "node_seconds_mean": round(statistics.mean(node_s.values()), 3),
            "node_bytes_sent_mean": round(statistics.mean(result.bytes_sent.values())),
            "node_bytes_received_mean": round(statistics.mean(result.bytes_received.values())),
            "plain_vector_bytes": dimension * 4}


def build_parser() -> argparse.ArgumentParser:
    """The command's flags."""
    parser = Parser(prog="python -m benchmarks.secagg", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=at_least(2), nargs="+", default=[10, 100])
    parser.add_argument("--neighbours", type=even_or_zero, nargs="+", default=[0],
                        help="SecAgg+ neighbours per node, each a run (0: all others; default: 0)")
    parser.add_argument("--dimension", type=at_least(1), default=39_700)
    parser.add_argument("--out", type=Path)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    points = [run(n, args.dimension, k) for n in args.nodes for k in args.neighbours]
    text = json.dumps({"points": points}, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
