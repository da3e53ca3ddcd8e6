"""Count-only rounds with distributed user-level noise (``clip-warmup-rounds`` with
``user-noise = "distributed"``), in process with the real ClientApp and SecAgg+: each node
sends only (2b − 1)·k plus a discrete Gaussian share sized for its own policy's honest
shares (not the cohort it is shown), the server's secure sum has one coordinate, S follows
Andrew et al.'s step from the decoded count, the model does not move, and the count costs
what central noise's count costs (dp-accounting's Gaussian of multiplier 2σ_b)."""

import math

import numpy as np
import pytest
from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent

from fedpriv.privacy import PrivacyLedger, epsilon_of
from fedpriv.privacy.events import DistributedDiscreteGaussianEvent
from fedpriv.privacy.userlevel import COUNT_ONLY_SCALE
from server.run import run_server
from tests.flower.inprocess import InProcessGrid, node_config
from tests.userlevel.test_distributed_user import DELTA, Spy, _centred, _dpa, _policy, _run_config, _same

pytestmark = pytest.mark.usefixtures("task_identity")

NODES, COHORT, ROUNDS, WARMUP, MIN_COHORT = 4, 3, 3, 2, 2
START_CLIP, QUANTILE, CLIP_LR, WARMUP_LR, COUNT_NOISE = 50.0, 0.5, 0.2, 1.5, 2.0


def test_a_distributed_count_only_round_sums_the_bits_alone_and_books_the_counts_cost(
        tmp_path, shared_data_dir, monkeypatch):
    config = _run_config(shared_data_dir, tmp_path, NODES, COHORT, ROUNDS, **{
        "clip-quantile": QUANTILE, "clip-lr": CLIP_LR, "clip-count-noise": COUNT_NOISE, "user-clip": START_CLIP,
        "clip-warmup-rounds": WARMUP, "clip-warmup-lr": WARMUP_LR})
    policies = {10 + i: node_config(i, NODES, tmp_path, **_policy(shared_data_dir, i, **{"min-cohort": MIN_COHORT}))
                for i in range(NODES)}
    spy = Spy(monkeypatch)
    history = run_server(InProcessGrid(config, policies), config)
    assert len(history.rounds) == ROUNDS
    k, q, clip, calls = COUNT_ONLY_SCALE, COHORT / NODES, START_CLIP, 0
    share = 2 * COUNT_NOISE * k / math.sqrt(MIN_COHORT)  # the node's policy's honest shares, not the cohort's
    node_events: dict[str, list] = {str(i): [] for i in range(NODES)}
    for r in range(1, WARMUP + 1):
        round_log = history.rounds[r - 1]
        assert round_log.train_metrics["count_only"] == 1
        assert round_log.train_metrics["user_clip"] == pytest.approx(clip, rel=1e-12)
        vectors = []
        for cid in round_log.participants:
            total = spy.totals[calls]
            vector, lattice, sent_share = spy.vectors[calls]
            calls += 1
            assert vector.shape == (1,) and lattice.dimension == 1, "the bit alone leaves the node"
            assert total[0] == k, "every delta is under S = 50"
            assert sent_share == pytest.approx(share, rel=1e-12)
            node_events[cid].append(DistributedDiscreteGaussianEvent(share, MIN_COHORT, 2 * k, 1))
            vectors.append(vector)
        summed = _centred(np.sum(np.stack(vectors).astype(object), axis=0), 1 << lattice.modulus_bits)
        estimate = (float(summed[0]) / (2 * k)) / (q * NODES) + 0.5
        estimate = min(1.0, max(0.0, estimate))  # b̃ estimates a fraction: clamped to [0, 1]
        clip *= math.exp(-WARMUP_LR * (estimate - QUANTILE))
    assert len(spy.rows) == len(history.rounds[WARMUP].participants), "deltas were encoded in round 3 alone"
    assert max(len(r.participants) for r in history.rounds[:WARMUP]) > MIN_COHORT, \
        "a node was shown a cohort larger than its min-cohort, and sized its share on the latter"
    assert history.rounds[WARMUP].train_metrics["user_clip"] == pytest.approx(clip, rel=1e-12)
    assert [r.test_accuracy for r in history.rounds[:WARMUP]] == [history.initial["test_accuracy"]] * WARMUP

    server = PrivacyLedger.load(tmp_path / "server" / "ledger.json")
    nominal = math.floor(q * NODES)
    for i in range(NODES):
        for booked in server.events(str(i))[:WARMUP]:
            assert booked.sample_rate == q
            _same(booked.event, DistributedDiscreteGaussianEvent(2 * COUNT_NOISE * k / math.sqrt(nominal), nominal,
                                                                 k, 1))
        booked = PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json").events(str(i))
        for event, expected in zip(booked, node_events[str(i)], strict=False):  # its count-only rounds first
            _same(event, expected)
    # the discrete count costs what the central count does, up to the discreteness (< 1 %)
    central = _dpa([PoissonSampledDpEvent(q, GaussianDpEvent(2 * COUNT_NOISE))])
    assert epsilon_of(server.events("0")[0], DELTA) == pytest.approx(central, rel=0.01)
