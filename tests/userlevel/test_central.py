"""Central user-level DP-FedAvg end to end, in process (``server.run`` with the real
ClientApp): the new global model is the initial one plus, each round, (Σ clipped deltas +
N(0, (z_Δ S)²)) / (q·P), recomputed here from the replies and the seeded stream; the
cohort is the Poisson draw of that stream; S follows Andrew et al.'s update; the server
books every client every round and each node books only the rounds it took part in."""

import math

import numpy as np
import pytest

from fedpriv.federation import protocol
from fedpriv.models import build_model
from fedpriv.privacy import GaussianEvent, PoissonSampledEvent, PrivacyLedger
from fedpriv.seeding import derive_seed
from server.run import run_server
from server.state import ServerState
from tests.flower.inprocess import InProcessGrid, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

NODES, COHORT, ROUNDS, SEED = 3, 2, 2, 7
Z, CLIP, QUANTILE, CLIP_LR, COUNT_NOISE = 1.0, 0.05, 0.5, 0.2, 2.0


def _run_config(data_dir, state, **extra):
    return {"rounds": ROUNDS, "min-clients": NODES, "limit-train": 60, "limit-test": 40, "model": "cnn",
            "data-dir": str(data_dir), "state-dir": str(state / "server"), "privacy": "user", "cohort": COHORT,
            "user-clip": CLIP, "clip-quantile": QUANTILE, "clip-lr": CLIP_LR, "clip-count-noise": COUNT_NOISE,
            "noise-multiplier": Z, "server-randomness": "seeded", "seed": SEED, "lot-size": 10, "lr": 0.1,
            "epsilon-budget": 100.0, **extra}


def _nodes(state, data_dir, **policy):
    keys = {"epsilon-budget": 100.0, "public-num-examples": True, "allow-central-user": True,
            "data-dir": str(data_dir), **policy}
    return {10 + i: node_config(i, NODES, state, **keys) for i in range(NODES)}


def _replies_by_round(grid):
    rounds: dict[int, dict[str, tuple[dict, int]]] = {}
    for reply in grid.log:
        if reply.has_error() or "user" not in reply.content.metric_records:  # a refusal, a QUERY's reply
            continue
        entry = protocol.read_charge(reply.content.config_records[protocol.PRIVACY]).entry
        server_round = int(entry.split("/")[1].removeprefix("round-"))
        delta = {k: a.numpy().astype(np.float64) for k, a in reply.content.array_records[protocol.ARRAYS].items()}
        bit = int(reply.content.metric_records["user"]["under-clip"])
        rounds.setdefault(server_round, {})[str(reply.metadata.src_node_id - 10)] = (delta, bit)
    return rounds


def test_the_aggregate_is_the_clipped_sum_plus_the_seeded_noise_over_the_expected_cohort(tmp_path, shared_data_dir):
    config = _run_config(shared_data_dir, tmp_path)
    grid = InProcessGrid(config, _nodes(tmp_path, shared_data_dir))
    history = run_server(grid, config)
    assert len(history.rounds) == ROUNDS

    q = COHORT / NODES
    z_delta = 1 / math.sqrt(Z**-2 - (2 * COUNT_NOISE) ** -2)  # Andrew et al. 2021, Theorem 1
    theta = {k: v.detach().double().numpy() for k, v in build_model("cnn", SEED).state_dict().items()}
    replies, clip = _replies_by_round(grid), CLIP
    for r in range(1, ROUNDS + 1):
        rng = np.random.default_rng(derive_seed(SEED, "user-level", r))
        cohort = {str(i) for i, u in enumerate(rng.random(NODES)) if u < q}
        assert set(replies.get(r, {})) == cohort, "the cohort is the seeded Poisson draw"
        got = [replies[r][c] for c in sorted(cohort, key=int)]
        for delta, _ in got:
            assert math.sqrt(sum(float(np.sum(d * d)) for d in delta.values())) <= clip * (1 + 1e-6)
        for name in theta:
            total = sum((d[name] for d, _ in got), np.zeros_like(theta[name]))
            total += rng.standard_normal(theta[name].size).reshape(theta[name].shape) * z_delta * clip
            theta[name] = (theta[name] + total / (q * NODES)).astype(np.float32).astype(np.float64)
        estimate = (sum(b - 0.5 for _, b in got) + rng.standard_normal(1)[0] * COUNT_NOISE) / (q * NODES) + 0.5
        estimate = min(1.0, max(0.0, estimate))  # b̃ estimates a fraction: clamped to [0, 1]
        assert history.rounds[r - 1].train_metrics["user_clip"] == pytest.approx(clip)
        clip *= math.exp(-CLIP_LR * (estimate - QUANTILE))

    _, arrays = ServerState(tmp_path / "server").load()
    for name, value in theta.items():
        np.testing.assert_allclose(arrays[name].numpy(), value, rtol=1e-5, atol=1e-6)
    assert history.resolved["user_level"]["final_clip"] == pytest.approx(clip)

    server = PrivacyLedger.load(tmp_path / "server" / "ledger.json")
    for i in range(NODES):
        assert server.events(str(i)) == (PoissonSampledEvent(q, GaussianEvent(Z)),) * ROUNDS
        node = PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json")
        took_part = sum(str(i) in replies.get(r, {}) for r in range(1, ROUNDS + 1))
        assert node.events(str(i)) == (GaussianEvent(Z / 2),) * took_part


def test_a_node_that_does_not_trust_the_servers_noise_refuses_and_books_nothing(tmp_path, shared_data_dir):
    config = _run_config(shared_data_dir, tmp_path, cohort=NODES)
    grid = InProcessGrid(config, _nodes(tmp_path, shared_data_dir, **{"allow-central-user": False}))
    history = run_server(grid, config)
    assert all("allow-central-user" in reason for r in history.rounds for reason in r.failed.values())
    assert all(len(r.failed) == NODES for r in history.rounds)
    for i in range(NODES):
        node = PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json")
        assert node.events(str(i)) == ()


def test_a_reply_over_the_clip_or_with_a_forged_bit_or_charge_is_rejected():
    from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict

    from fedpriv.privacy.charge import Charge
    from server.userlevel import check_user_reply

    global_arrays = ArrayRecord({"w": Array(np.zeros((2, 2), dtype=np.float32))})
    charge = Charge("run-x/round-1/train", (GaussianEvent(Z / 2),))

    def reply(delta, bit=1, events=charge.events):
        content = RecordDict({protocol.ARRAYS: ArrayRecord({"w": Array(np.asarray(delta, dtype=np.float32))}),
                              protocol.PRIVACY: protocol.charge_record(Charge(charge.entry, events)),
                              "user": MetricRecord({"under-clip": bit})})
        return Message(content, 1, MessageType.TRAIN)

    assert check_user_reply(reply([[0.3, 0.0], [0.0, 0.4]]), charge, global_arrays, 0.5) is None
    assert "exceeds the clip" in check_user_reply(reply([[0.3, 0.0], [0.0, 0.41]]), charge, global_arrays, 0.5)
    assert "0 or 1" in check_user_reply(reply([[0.0, 0.0], [0.0, 0.0]], bit=7), charge, global_arrays, 0.5)
    assert "differs from the booked" in check_user_reply(
        reply([[0.0, 0.0], [0.0, 0.0]], events=(GaussianEvent(Z),)), charge, global_arrays, 0.5)
    assert "non-finite" in check_user_reply(reply([[np.nan, 0.0], [0.0, 0.0]]), charge, global_arrays, 0.5)
