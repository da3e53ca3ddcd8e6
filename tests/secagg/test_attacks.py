"""A server that lies to the nodes of a secure sum, and a node that lies to the server.

Each node checks what its privacy rests on and refuses before answering: a node listed both
active and dead, a second unmask request, a cohort below its minimum (whatever the server
claims), a threshold that colluders or two disjoint honest groups could meet, too few
survivors, stages replayed or out of order. A malformed reply drops only its sender."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from flwr.common.secure_aggregation.crypto.shamir import combine_shares

from fedpriv.secagg import NodeState, Requirements, SecAggRefusal, Stage, answer, keys, prg
from fedpriv.secagg.server import SecureAggregation
from tests.secagg.simulate import simulate

D = 64
REQ = Requirements(min_cohort=3, min_survivors=3, max_colluders=0)


class Honest:
    """An honest server's round with ``n`` nodes, stopped before a stage the test then forges."""

    def __init__(self, n: int, *, threshold: int, req: Requirements = REQ, until: Stage = Stage.UNMASK) -> None:
        self.nodes = list(range(1, n + 1))
        self.req = req
        rng = np.random.default_rng(7)
        self.x = {u: rng.integers(0, 1 << 32, D, dtype=np.uint64) for u in self.nodes}
        self.states = {u: NodeState() for u in self.nodes}
        self.agg = SecureAggregation(self.nodes, dimension=D, modulus_bits=32, threshold=threshold, round_key="r")
        self.last: dict[Stage, dict[int, dict[str, Any]]] = {}
        while self.agg.stage is not until:
            self.step()

    def step(self) -> None:
        configs = self.agg.requests()
        self.last[self.agg.stage] = configs
        self.agg.receive({u: self.ask(u, c) for u, c in configs.items()})

    def ask(self, u: int, config: dict[str, Any]) -> dict[str, Any]:
        return answer(self.states[u], self.req, u, config, lambda info: self.x[u])


def refused(server: Honest, u: int, config: dict[str, Any], why: str) -> None:
    with pytest.raises(SecAggRefusal, match=why):
        server.ask(u, config)


def unmask(active: list[int], dead: list[int]) -> dict[str, Any]:
    return {"stage": "unmask", "active": active, "dead": dead}


def test_a_node_listed_both_active_and_dead_is_refused() -> None:
    server = Honest(5, threshold=4)
    for u in server.nodes:
        refused(server, u, unmask(server.nodes, [1]), "both active and dead")


def test_a_second_unmask_request_gets_nothing_so_no_node_loses_both_secrets() -> None:
    server = Honest(5, threshold=4)
    first = {u: server.ask(u, unmask([1, 2, 3, 4, 5], [])) for u in server.nodes}  # b of every node
    assert all(reply["ids"] == [1, 2, 3, 4, 5] for reply in first.values())
    for u in (2, 3, 4, 5):  # now claim node 1 dead: its sk1 would unmask its vector
        refused(server, u, unmask([2, 3, 4, 5], [1]), "each stage is answered once")


def test_a_refused_unmask_cannot_be_retried_with_other_lists() -> None:
    server = Honest(5, threshold=4)
    refused(server, 2, unmask([1, 2, 3, 4, 5], [1]), "both active and dead")
    refused(server, 2, unmask([2, 3, 4, 5], [1]), "each stage is answered once")


def test_a_cohort_below_the_nodes_minimum_is_refused_before_any_vector_is_sent() -> None:
    """The server claims 1,000 nodes but forwards 3 keys; the nodes ask for at least 5."""
    req = Requirements(min_cohort=5, min_survivors=4, max_colluders=1)
    r = simulate(3, D, threshold=3, requirements=req,
                 request=lambda stage, u, c: {**c, "cohort": 1000} if stage is Stage.SETUP else c)
    assert set(r.refusals) == {11, 12, 13} and all("below this node's minimum of 5" in m for m in r.refusals.values())
    assert r.contributed == set()
    assert not any(stage in (Stage.SHARE_KEYS, Stage.COLLECT) for stage, _, _ in r.received)
    assert r.result.sum is None


@pytest.mark.parametrize("threshold, why", [(1, "exceed the 1 tolerated colluders"), (6, "at most the cohort"),
                                            (3, r"exceed \(cohort 5 \+ colluders 1\) / 2")])
def test_a_threshold_colluders_could_meet_is_refused(threshold: int, why: str) -> None:
    """The server sends each node the forged ``threshold`` (its own bookkeeping says 4)."""
    req = Requirements(min_cohort=3, min_survivors=3, max_colluders=1)
    forge = lambda stage, u, c: {**c, "threshold": threshold} if stage is Stage.SETUP else c  # noqa: E731
    r = simulate(5, D, threshold=4, requirements=req, request=forge)
    assert len(r.refusals) == 5 and all(re.search(why, m) for m in r.refusals.values())
    assert r.contributed == set()


def test_split_lists_cannot_rebuild_both_secrets_of_one_node() -> None:
    """The server tells half the cohort that node 1 is active and the other half that it is
    dead: with t <= n/2 each half could hand over t shares (b and sk1 of node 1) and its
    vector would be unmasked. The nodes refuse such a threshold at SHARE_KEYS."""
    req = Requirements(min_cohort=3, min_survivors=3, max_colluders=0)
    server = Honest(6, threshold=3, req=req, until=Stage.SHARE_KEYS)
    replies = {}
    for u, config in server.agg.requests().items():
        try:
            replies[u] = server.ask(u, config)
        except SecAggRefusal:
            pass
    server.agg.receive(replies)
    if server.agg.done:  # every node refused: nothing was shared
        assert replies == {}
        return
    server.step()  # collect: the masked vectors
    masked_1 = server.agg.vectors[1]
    a_side = {u: server.ask(u, unmask([1, 2, 3], [4, 5, 6])) for u in (1, 2, 3)}
    b_side = {u: server.ask(u, unmask([4, 5, 6], [1, 2, 3])) for u in (4, 5, 6)}
    seed = combine_shares([a["shares"][0] for a in a_side.values()])
    sk1 = keys.private_key(combine_shares([b["shares"][3] for b in b_side.values()]))
    x = masked_1 - prg.mask(seed, "private", "r", D, 32)
    for v in (2, 3, 4, 5, 6):
        pairwise = prg.mask(keys.mask_key(sk1, keys.public_key(server.agg.pk1[v])), "pairwise", "r", D, 32)
        x = x - pairwise if 1 > v else x + pairwise
    assert not np.array_equal(prg.reduce(x, 32), server.x[1]), "the server unmasked node 1's vector alone"


@pytest.mark.parametrize("forged, why", [
    (unmask([1, 2, 3, 4, 99], []), "outside the cohort"),
    (unmask([2, 3, 4, 5], []), "not listed active"),
    (unmask([1, 2, 2, 3], []), "repeated"),
    (unmask([1, 2], [3, 4, 5]), "this node needs at least"),
])
def test_forged_unmask_lists_are_refused(forged: dict[str, Any], why: str) -> None:
    server = Honest(5, threshold=3, req=Requirements(min_cohort=5, min_survivors=3, max_colluders=0))
    refused(server, 1, forged, why)


def test_masking_with_too_few_others_is_refused_before_the_vector_is_computed() -> None:
    server = Honest(5, threshold=4, until=Stage.COLLECT)
    config = server.agg.requests()[1]
    few = {**config, "sources": config["sources"][:1], "ciphertexts": config["ciphertexts"][:1]}
    with pytest.raises(SecAggRefusal, match="only 1 other nodes sent shares"):
        answer(server.states[1], REQ, 1, few, lambda info: pytest.fail("the vector was asked for"))


def test_replayed_or_out_of_order_stages_are_refused() -> None:
    server = Honest(4, threshold=3, until=Stage.SHARE_KEYS)
    setup = server.last[Stage.SETUP][1]
    refused(server, 1, {"stage": "collect", "sources": [], "ciphertexts": []}, "collect after setup")
    refused(server, 1, setup, "was set up before")  # a replayed setup of the same round
    server = Honest(4, threshold=3, until=Stage.UNMASK)
    collect = server.last[Stage.COLLECT][2]
    refused(server, 2, collect, "collect after collect")  # a second masked vector with the same masks
    share_keys = server.last[Stage.SHARE_KEYS][3]
    refused(server, 3, share_keys, "share-keys after collect")


def test_a_second_setup_starts_afresh_and_drops_the_old_shares() -> None:
    server = Honest(4, threshold=3, until=Stage.UNMASK)
    fresh = {**server.last[Stage.SETUP][1], "round-key": "r-again"}
    server.ask(1, fresh)
    assert server.states[1].holders == [] and server.states[1].seed == b""
    refused(server, 1, unmask([1, 2, 3, 4], []), "unmask after setup")


@pytest.mark.parametrize("stage, forge", [
    (Stage.SETUP, lambda r: {**r, "pk1": "not bytes"}),
    (Stage.SETUP, lambda r: {**r, "pk2": b"-----BEGIN PUBLIC KEY-----\ngarbage"}),
    (Stage.SHARE_KEYS, lambda r: {**r, "destinations": r["destinations"][:-1]}),
    (Stage.SHARE_KEYS, lambda r: {**r, "commitment": 5}),
    (Stage.COLLECT, lambda r: {**r, "masked": r["masked"][:-4]}),
    (Stage.COLLECT, lambda r: {**r, "masked": np.zeros(300, dtype=np.float64).tobytes()}),
    (Stage.COLLECT, lambda r: {"masked": [1, 2, 3]}),
    (Stage.UNMASK, lambda r: {**r, "shares": r["shares"][:-1]}),
    (Stage.UNMASK, lambda r: {**r, "ids": list(reversed(r["ids"]))}),
])
def test_a_malformed_reply_drops_its_node_and_the_sum_over_the_others_is_exact(stage, forge) -> None:
    r = simulate(8, 300, reply=lambda s, u, reply: forge(reply) if (s is stage and u == 13) else reply)
    assert r.result.reason is None and 13 in r.result.dropped
    assert np.array_equal(r.result.sum, r.true_sum(32))
    assert (13 in r.result.survivors) == (stage is Stage.UNMASK)


def test_a_node_sending_wrong_shares_is_outvoted_not_summed_wrong() -> None:
    def corrupt(stage: Stage, u: int, reply: dict[str, Any]) -> dict[str, Any]:
        if stage is Stage.UNMASK and u == 14:
            return {**reply, "shares": [s[:4] + bytes(len(s) - 4) for s in reply["shares"]]}
        return reply
    r = simulate(8, 300, threshold=5, lose={Stage.COLLECT: {18}}, reply=corrupt)
    assert r.result.reason is None
    assert np.array_equal(r.result.sum, r.true_sum(32))
