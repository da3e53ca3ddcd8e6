"""SecAgg+ on a sparse graph (Bell et al., CCS 2020): the server draws a random k-regular
Harary graph; each node shares, masks and unmasks only within its group (itself and its k
neighbours), and accepts a group smaller than the cohort only where its policy opts in.

The sums are checked against the plain modular sum in Python integers; the graph against
what each node was actually sent; the nodes' refusals against a server that forges lists."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes

from fedpriv.secagg import NodeState, Requirements, SecAggRefusal, Stage, Vector, answer, graph
from fedpriv.secagg.server import SecureAggregation
from tests.secagg.simulate import Round, simulate
from tests.secagg.test_server_view import check_masked_vectors

D = 64
N, K = 16, 6
T = graph.threshold(N, K)  # 5 of each group of 7


def sent(r: Round, stage: Stage) -> dict[int, dict[str, Any]]:
    """What each node answered at ``stage``."""
    return {u: reply for s, u, reply in r.received if s is stage}


def recorder(into: dict[tuple[Stage, int], dict[str, Any]]):  # type: ignore[no-untyped-def]
    def record(stage: Stage, u: int, config: dict[str, Any]) -> dict[str, Any]:
        into[stage, u] = config
        return config
    return record


@pytest.mark.parametrize("n, k", [(5, 2), (16, 6), (31, 10), (100, 20)])
def test_the_graph_is_k_regular_symmetric_and_drawn_from_the_seed(n: int, k: int) -> None:
    nodes = list(range(100, 100 + n))
    g = graph.harary(nodes, k, "run/round-1")
    assert g is not None and set(g) == set(nodes)
    assert all(len(g[u]) == k and u not in g[u] and all(u in g[v] for v in g[u]) for u in nodes)
    assert graph.harary(list(reversed(nodes)), k, "run/round-1") == g  # the order the server lists them in
    assert graph.harary(nodes, k, "run/round-2") != g  # a fresh graph each round
    assert graph.harary(nodes, 0, "r") is None and graph.harary(nodes, n - n % 2, "r") is None


def test_sums_are_exact_and_each_node_is_sent_only_its_neighbours() -> None:
    configs: dict[tuple[Stage, int], dict[str, Any]] = {}
    r = simulate(N, D, neighbours=K, threshold=T, request=recorder(configs))
    nodes = set(r.vectors)
    assert r.result.reason is None and set(r.result.survivors) == nodes
    assert np.array_equal(r.result.sum, r.true_sum(32))
    group = {u: set(configs[Stage.SHARE_KEYS, u]["ids"]) for u in nodes}
    assert all(set(configs[Stage.SHARE_KEYS, u]["cohort"]) == nodes and u in group[u] for u in nodes)
    assert all(len(group[u]) == K + 1 and all(u in group[v] for v in group[u]) for u in nodes)  # k-regular
    assert all(set(reply["destinations"]) == group[u] - {u} for u, reply in sent(r, Stage.SHARE_KEYS).items())
    assert all(set(configs[Stage.COLLECT, u]["sources"]) == group[u] - {u} for u in nodes)
    assert all(set(reply["ids"]) == group[u] for u, reply in sent(r, Stage.UNMASK).items())
    assert all(set(configs[Stage.UNMASK, u]["signers"]) == group[u] for u in nodes)


@pytest.mark.parametrize("stage", list(Stage))
def test_sums_are_exact_with_dropouts_at_each_stage(stage: Stage) -> None:
    """Two nodes lose their reply at ``stage``: those lost before their masked vector is in
    are left out (their pairwise masks removed with their neighbours' shares of sk1), those
    lost after it stay in the sum."""
    lost = {11, 12}
    r = simulate(N, D, neighbours=K, threshold=T, lose={stage: lost}, seed=5)
    assert r.result.reason is None, r.result.reason
    expected = set(r.vectors) - (lost if stage in (Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT) else set())
    assert set(r.result.survivors) == expected
    assert np.array_equal(r.result.sum, r.true_sum(32))


def test_masked_vectors_on_a_sparse_graph_are_uniform_and_independent_of_the_input() -> None:
    check_masked_vectors(8, neighbours=4)


def test_full_graph_when_k_is_zero_or_reaches_the_cohort() -> None:
    for k in (0, 6, 8):  # n - 1 = 5
        configs: dict[tuple[Stage, int], dict[str, Any]] = {}
        r = simulate(6, D, neighbours=k, requirements=Requirements(2, 2, 0), request=recorder(configs))
        assert np.array_equal(r.result.sum, r.true_sum(32))
        assert all(set(c) == {"stage", "ids", "pk1", "pk2", "pk3", "certificates", "keys-signatures"}
                   and c["ids"] == sorted(r.vectors)
                   for (s, _), c in configs.items() if s is Stage.SHARE_KEYS)


def test_a_node_whose_policy_sets_no_minimum_refuses_a_sparse_graph() -> None:
    r = simulate(N, D, neighbours=K, threshold=T, requirements=Requirements(min_cohort=2, min_survivors=2,
                                                                             max_colluders=0))
    assert len(r.refusals) == N and all("demands the full graph" in m for m in r.refusals.values())
    assert r.contributed == set() and r.result.sum is None


def subset_of_the_cohort(stage: Stage, u: int, config: dict[str, Any]) -> dict[str, Any]:
    """A full-graph server that tells each node 3 others of the cohort's 9 as its group (and a
    threshold that fits 4): the node would share and mask within 4 while believing in 10."""
    if stage is Stage.SETUP:
        return {**config, "threshold": 3}
    if stage is not Stage.SHARE_KEYS:
        return config
    others = sorted({11, 12, 13, 14} - {u})[:3]
    keep = [i for i, v in enumerate(config["ids"]) if v == u or v in others]
    return {**{name: [config[name][i] for i in keep] for name in ("ids", "pk1", "pk2", "pk3")},
            "stage": config["stage"], "cohort": config["ids"]}


def test_a_node_without_a_minimum_refuses_a_group_smaller_than_the_cohort_a_server_forges() -> None:
    r = simulate(10, D, threshold=7, request=subset_of_the_cohort)
    assert set(r.refusals) == set(r.vectors) and all("demands the full graph" in m for m in r.refusals.values())
    assert r.contributed == set()


def test_a_node_refuses_fewer_neighbours_than_its_minimum() -> None:
    req = Requirements(min_cohort=2, min_survivors=2, max_colluders=0, min_neighbours=K + 2)
    r = simulate(N, D, neighbours=K, threshold=T, requirements=req)
    assert len(r.refusals) == N and all(f"{K} neighbours are below this node's minimum of {K + 2}" in m
                                        for m in r.refusals.values())
    assert r.contributed == set() and r.result.sum is None


def test_a_node_refuses_a_neighbour_outside_the_cohort() -> None:
    """The server slips node 99 (its own keys) into each node's group but not into the cohort."""
    fake = [public_key_to_bytes(generate_key_pairs()[1]) for _ in range(3)]

    def forge(stage: Stage, u: int, config: dict[str, Any]) -> dict[str, Any]:
        if stage is not Stage.SHARE_KEYS:
            return config
        return {**config, "ids": config["ids"] + [99], "pk1": config["pk1"] + [fake[0]],
                "pk2": config["pk2"] + [fake[1]], "pk3": config["pk3"] + [fake[2]],
                "cohort": config.get("cohort", config["ids"])}

    for neighbours, threshold in ((0, 7), (4, 4)):
        r = simulate(10, D, neighbours=neighbours, threshold=threshold, request=forge)
        assert set(r.refusals) == set(r.vectors) and all("not in the cohort" in m for m in r.refusals.values())
        assert r.contributed == set()


def test_a_survivor_with_too_few_surviving_neighbours_discards_the_round() -> None:
    """Three of node 11's six neighbours drop at COLLECT (after sharing, before masking): 4 of
    its group survive, t = 5. The round is discarded at once, the reason naming node 11: no
    node is asked to sign or to unmask."""
    g = graph.harary(list(range(11, 11 + N)), K, "run/round-1")
    assert g is not None
    lost = set(sorted(g[11])[:3])
    r = simulate(N, D, neighbours=K, threshold=T, lose={Stage.COLLECT: lost})
    assert r.result.sum is None and "node 11 has 4 surviving neighbours" in (r.result.reason or "")
    assert not sent(r, Stage.CONSISTENCY) and not sent(r, Stage.UNMASK)


class Sparse:
    """An honest sparse-graph round stopped before ``until``, its stages driven by hand."""

    def __init__(self, until: Stage) -> None:
        self.nodes = list(range(1, N + 1))
        self.req = Requirements(min_cohort=2, min_survivors=2, max_colluders=0, min_neighbours=K)
        self.states = {u: NodeState() for u in self.nodes}
        self.agg = SecureAggregation(self.nodes, dimension=D, modulus_bits=32, threshold=T, round_key="r",
                                     neighbours=K)
        while self.agg.stage is not until:
            self.agg.receive({u: self.ask(u, c) for u, c in self.agg.requests().items()})

    def ask(self, u: int, config: dict[str, Any]) -> dict[str, Any]:
        return answer(self.states[u], self.req, u, config, lambda info: Vector(np.zeros(D, dtype=np.uint64), {}))


def test_a_node_refuses_survivors_with_fewer_than_t_of_its_group() -> None:
    server = Sparse(Stage.CONSISTENCY)
    assert server.agg.graph is not None
    neighbours = server.agg.graph[1]
    active = [u for u in server.nodes if u not in sorted(neighbours)[:3]]  # 4 of its group of 7 left
    with pytest.raises(SecAggRefusal, match="4 active nodes of its group"):
        server.ask(1, {"stage": "consistency", "active": active})


def test_a_node_unmasks_only_with_t_signatures_of_its_own_group() -> None:
    """The server shows node 1 the survivors signed by t nodes outside its group."""
    server = Sparse(Stage.UNMASK)
    assert server.agg.graph is not None
    request = server.agg.requests()[1]
    strangers = [u for u in server.nodes if u != 1 and u not in server.agg.graph[1]][:T]
    forged = {**request, "signers": strangers, "signatures": [server.agg.signatures[u] for u in strangers]}
    with pytest.raises(SecAggRefusal, match="does not verify"):
        server.ask(1, forged)



class ChosenGraph(SecureAggregation):
    """A server that draws the sparse graph from a key of its choosing, not the round key."""

    def receive(self, replies: Any) -> None:
        setup = self.stage is Stage.SETUP
        super().receive(replies)
        if setup and self.graph is not None:
            self.graph = graph.harary(self.live, self.neighbours, "the server's choice")


def test_a_node_refuses_a_group_that_is_not_its_neighbourhood_in_the_rounds_harary_graph() -> None:
    nodes = list(range(1, N + 1))
    req = Requirements(min_cohort=2, min_survivors=2, max_colluders=0, min_neighbours=K)
    states = {u: NodeState() for u in nodes}
    agg = ChosenGraph(nodes, dimension=D, modulus_bits=32, threshold=T, round_key="r", neighbours=K)
    agg.receive({u: answer(states[u], req, u, c, lambda info: pytest.fail("no vector"))
                 for u, c in agg.requests().items()})
    for u, config in agg.requests().items():  # share-keys: each group of 7, from the server's graph
        with pytest.raises(SecAggRefusal, match="Harary graph"):
            answer(states[u], req, u, config, lambda info: pytest.fail("no vector"))
