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
from flwr.supercore.primitives.asymmetric import generate_key_pairs

from fedpriv.secagg import NodeState, Requirements, SecAggRefusal, Stage, Vector, answer, keys, prg
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
        if until is Stage.UNMASK:  # what an honest server would send: the survivors and their signatures
            self.honest_unmask = dict(next(iter(self.agg.requests().values())))

    def unmask(self, active: list[int], dead: list[int]) -> dict[str, Any]:
        """The honest unmask request with forged lists (the signatures on the real survivors)."""
        return {**self.honest_unmask, "active": active, "dead": dead}

    def step(self) -> None:
        configs = self.agg.requests()
        self.last[self.agg.stage] = configs
        self.agg.receive({u: self.ask(u, c) for u, c in configs.items()})

    def ask(self, u: int, config: dict[str, Any]) -> dict[str, Any]:
        return answer(self.states[u], self.req, u, config, lambda info: Vector(self.x[u], {}))


def refused(server: Honest, u: int, config: dict[str, Any], why: str) -> None:
    with pytest.raises(SecAggRefusal, match=why):
        server.ask(u, config)


def test_a_node_listed_both_active_and_dead_is_refused() -> None:
    server = Honest(5, threshold=4)
    for u in server.nodes:
        refused(server, u, server.unmask(server.nodes, [1]), "both active and dead")


def test_a_second_unmask_request_gets_nothing_so_no_node_loses_both_secrets() -> None:
    server = Honest(5, threshold=4)
    first = {u: server.ask(u, server.unmask([1, 2, 3, 4, 5], [])) for u in server.nodes}  # b of every node
    assert all(reply["ids"] == [1, 2, 3, 4, 5] for reply in first.values())
    for u in (2, 3, 4, 5):  # now claim node 1 dead: its sk1 would unmask its vector
        refused(server, u, server.unmask([2, 3, 4, 5], [1]), "each stage is answered once")


def test_a_refused_unmask_cannot_be_retried_with_other_lists() -> None:
    server = Honest(5, threshold=4)
    refused(server, 2, server.unmask([1, 2, 3, 4, 5], [1]), "both active and dead")
    refused(server, 2, server.unmask([2, 3, 4, 5], [1]), "each stage is answered once")


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
    """The server has nodes 1-3 sign survivors 1-3 and nodes 4-6 sign survivors 4-6, then
    asks 1-3 for b of node 1 and 4-6 for sk1 of node 1: with t = 3 <= n/2 each half has t
    signatures and t shares, and node 1's vector is unmasked alone. The nodes refuse such a
    threshold at SHARE_KEYS (2t > n + c)."""
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
    halves = {u: ([1, 2, 3] if u <= 3 else [4, 5, 6]) for u in server.nodes}
    signature = {u: server.ask(u, {"stage": "consistency", "active": halves[u]})["signature"] for u in server.nodes}
    shares = {}
    for u in server.nodes:
        signers = [v for v in server.nodes if halves[v] == halves[u]]
        shares[u] = server.ask(u, {"stage": "unmask", "active": halves[u], "dead": [v for v in server.nodes
                                                                                     if v not in halves[u]],
                                   "signers": signers, "signatures": [signature[v] for v in signers]})["shares"]
    seed = combine_shares([shares[u][0] for u in (1, 2, 3)])  # b of node 1 (first active)
    sk1 = keys.private_key(combine_shares([shares[u][3] for u in (4, 5, 6)]))  # sk1 of node 1 (first dead)
    x = masked_1 - prg.mask(seed, "private", "r", D, 32)
    for v in (2, 3, 4, 5, 6):
        key = keys.mask_key(sk1, keys.public_key(server.agg.pk1[v]), server.agg.settings[1])
        pairwise = prg.mask(key, "pairwise", "r", D, 32)
        x = x - pairwise if 1 > v else x + pairwise
    assert not np.array_equal(prg.reduce(x, 32), server.x[1]), "the server unmasked node 1's vector alone"


@pytest.mark.parametrize("forged, why", [
    ({"active": [1, 2, 3, 4, 99], "dead": []}, "outside the cohort"),
    ({"active": [2, 3, 4, 5], "dead": []}, "not listed active"),
    ({"active": [1, 2, 2, 3], "dead": []}, "repeated"),
    ({"active": [1, 2], "dead": [3, 4, 5]}, "this node needs at least"),
])
def test_forged_unmask_lists_are_refused(forged: dict[str, Any], why: str) -> None:
    server = Honest(5, threshold=3, req=Requirements(min_cohort=5, min_survivors=3, max_colluders=0))
    refused(server, 1, server.unmask(**forged), why)


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
    refused(server, 2, collect, "collect after consistency")  # a second masked vector with the same masks
    share_keys = server.last[Stage.SHARE_KEYS][3]
    refused(server, 3, share_keys, "share-keys after consistency")


def test_a_second_setup_starts_afresh_and_drops_the_old_shares() -> None:
    server = Honest(4, threshold=3, until=Stage.UNMASK)
    fresh = {**server.last[Stage.SETUP][1], "round-key": "r-again"}
    server.ask(1, fresh)
    assert server.states[1].holders == [] and server.states[1].seed == b""
    refused(server, 1, server.unmask([1, 2, 3, 4], []), "unmask after setup")


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


def test_a_server_cannot_have_two_survivor_lists_signed_and_unmask_a_smaller_sum() -> None:
    """Nodes 1-5 are shown survivors 1-6, nodes 6-10 survivors 5-10: each list gets 5
    signatures, fewer than t = 6, so no node unmasks (no sum of 6 instead of 10 is learnt)."""
    req = Requirements(min_cohort=6, min_survivors=6, max_colluders=0)
    server = Honest(10, threshold=6, req=req, until=Stage.CONSISTENCY)
    lists = {u: ([1, 2, 3, 4, 5, 6] if u <= 5 else [5, 6, 7, 8, 9, 10]) for u in server.nodes}
    signatures = {u: server.ask(u, {"stage": "consistency", "active": lists[u]})["signature"] for u in server.nodes}
    for u in server.nodes:
        same = [v for v in server.nodes if lists[v] == lists[u]]
        request = {"stage": "unmask", "active": lists[u], "dead": [v for v in server.nodes if v not in lists[u]],
                   "signers": same, "signatures": [signatures[v] for v in same]}
        refused(server, u, request, "fewer than the threshold of 6 signatures")


def test_an_unmask_list_other_than_the_signed_one_or_a_forged_signature_is_refused() -> None:
    server = Honest(5, threshold=4)
    refused(server, 1, {**server.honest_unmask, "active": [1, 2, 3, 4], "dead": [5]}, "not the list of survivors")
    server = Honest(5, threshold=4)
    request = dict(server.honest_unmask)
    request["signatures"] = [request["signatures"][1]] + request["signatures"][1:]
    refused(server, 1, request, "does not verify")


def test_nodes_computing_under_different_settings_give_no_sum() -> None:
    """Node 11 computed its vector at lattice scale 16, the others at 2^10: an honest server
    sees the digests differ and ends the round; the masks would not have cancelled anyway
    (``tests/flower/test_malicious_server.py`` plays the server that ignores this)."""
    r = simulate(4, D, settings=lambda u: {"lattice-scale": 16.0 if u == 11 else 1024.0})
    assert r.result.sum is None and "different settings" in (r.result.reason or "")
    same = simulate(4, D, settings=lambda u: {"lattice-scale": 1024.0})
    assert np.array_equal(same.result.sum, same.true_sum(32))


def test_a_pairwise_mask_depends_on_the_settings_digest() -> None:
    (sk_a, pk_a), (sk_b, pk_b) = generate_key_pairs(), generate_key_pairs()
    one, other = keys.settings_digest({"scale": 1024.0}), keys.settings_digest({"scale": 16.0})
    assert keys.mask_key(sk_a, pk_b, one) == keys.mask_key(sk_b, pk_a, one)  # both ends of the pair agree
    assert keys.mask_key(sk_a, pk_b, one) != keys.mask_key(sk_b, pk_a, other)
