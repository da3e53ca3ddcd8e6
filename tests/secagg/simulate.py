"""Run the pure secure-sum protocol over simulated nodes, with hooks for a server that loses
replies or lies: ``lose[stage]`` are nodes whose reply to that stage never arrives,
``request(stage, node, config)`` may rewrite what the server sends, ``reply(stage, node,
reply)`` what a (malicious) node answers. ``received`` is everything the server got;
``neighbours`` is SecAgg+'s k (nodes then accept k neighbours unless ``requirements`` say);
``settings(node)`` the settings each node computes its vector under."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedpriv.secagg import (
    NodeState,
    Requirements,
    SecAggRefusal,
    SecureAggregation,
    SecureSumResult,
    Stage,
    Vector,
    answer,
    graph,
)

Hook = Callable[[Stage, int, dict[str, Any]], dict[str, Any]]


@dataclass
class Round:
    result: SecureSumResult
    vectors: dict[int, np.ndarray]
    states: dict[int, NodeState]
    received: list[tuple[Stage, int, dict[str, Any]]] = field(default_factory=list)
    refusals: dict[int, str] = field(default_factory=dict)
    contributed: set[int] = field(default_factory=set)

    def true_sum(self, bits: int) -> np.ndarray:
        """Σ of the survivors' inputs mod 2^bits, in Python integers (independent of numpy wrap)."""
        d = len(next(iter(self.vectors.values())))
        return np.array([sum(int(self.vectors[n][i]) for n in self.result.survivors) % (1 << bits)
                         for i in range(d)], dtype=np.uint64)


def simulate(n: int, d: int, *, bits: int = 32, threshold: int | None = None,
             requirements: Requirements | None = None, vectors: Mapping[int, np.ndarray] | None = None,
             lose: Mapping[Stage, set[int]] | None = None, request: Hook | None = None, reply: Hook | None = None,
             round_key: str = "run/round-1", seed: int = 0, neighbours: int = 0,
             settings: Callable[[int], dict[str, Any]] = lambda u: {}) -> Round:
    nodes = list(range(11, 11 + n))
    rng = np.random.default_rng(seed)
    inputs = dict(vectors) if vectors is not None else {
        u: rng.integers(0, 1 << bits, d, dtype=np.uint64) for u in nodes}
    req = requirements or Requirements(min_cohort=2, min_survivors=2, max_colluders=0,
                                       min_neighbours=neighbours or None)
    states = {u: NodeState() for u in nodes}
    agg = SecureAggregation(nodes, dimension=d, modulus_bits=bits,
                            threshold=threshold or graph.threshold(n, neighbours), round_key=round_key,
                            neighbours=neighbours)
    out = Round(SecureSumResult(None, None, (), (), {}, {}, {}), inputs, states)
    while not agg.done:
        stage, replies = agg.stage, {}
        for u, config in agg.requests().items():
            if request is not None:
                config = request(stage, u, config)

            def contribute(info: Any, u: int = u) -> Vector:
                out.contributed.add(u)
                return Vector(inputs[u], settings(u))
            try:
                answered = answer(states[u], req, u, config, contribute)
            except SecAggRefusal as err:
                out.refusals[u] = str(err)
                continue
            if reply is not None:
                answered = reply(stage, u, answered)
            if u not in (lose or {}).get(stage, set()):
                replies[u] = answered
                out.received.append((stage, u, answered))
        agg.receive(replies)
    out.result = agg.result()
    return out
