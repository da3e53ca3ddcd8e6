"""Adaptive clipping's count-only rounds (``clip-warmup-rounds``): rounds 1..W release only
the noisy count under S, so S is placed before the model moves. In process through
``server.run.run_server`` and the real ClientApp: the model is untouched by those rounds,
S follows Andrew et al.'s step at the warm-up η from the seeded draws recomputed here, the
nodes send their bit and nothing else, and every ledger books what the closed forms say
(the centred count's sensitivity ½ to a client, 1 to a record)."""

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict

from fedpriv.federation import protocol, userlevel
from fedpriv.federation.settings import RunSettings, SettingsError
from fedpriv.models import build_model
from fedpriv.planning import Federation, plan
from fedpriv.privacy import GaussianEvent, PoissonSampledEvent, PrivacyLedger, calibrate_noise_multiplier
from fedpriv.privacy.charge import Charge
from fedpriv.seeding import derive_seed
from server.run import run_server
from server.state import ServerState
from server.userlevel import check_user_reply
from tests.flower.inprocess import InProcessGrid, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

NODES, COHORT, ROUNDS, WARMUP, SEED = 3, 2, 3, 2, 5
Z, CLIP, QUANTILE, CLIP_LR, WARMUP_LR, COUNT_NOISE = 1.0, 50.0, 0.5, 0.2, 1.5, 2.0


def _run_config(data_dir, state, **extra):
    return {"rounds": ROUNDS, "min-clients": NODES, "limit-train": 60, "limit-test": 40, "model": "cnn",
            "data-dir": str(data_dir), "state-dir": str(state / "server"), "privacy": "user", "cohort": COHORT,
            "user-clip": CLIP, "clip-quantile": QUANTILE, "clip-lr": CLIP_LR, "clip-count-noise": COUNT_NOISE,
            "clip-warmup-rounds": WARMUP, "clip-warmup-lr": WARMUP_LR, "noise-multiplier": Z,
            "server-randomness": "seeded", "seed": SEED, "lot-size": 10, "lr": 0.1, "epsilon-budget": 100.0,
            **extra}


def _train_replies(grid):
    """{round: {client: reply content}} of the accepted-looking TRAIN replies."""
    rounds: dict[int, dict[str, RecordDict]] = {}
    for reply in grid.log:
        if reply.has_error() or "user" not in reply.content.metric_records:
            continue
        entry = protocol.read_charge(reply.content.config_records[protocol.PRIVACY]).entry
        server_round = int(entry.split("/")[1].removeprefix("round-"))
        rounds.setdefault(server_round, {})[str(reply.metadata.src_node_id - 10)] = reply.content
    return rounds


def test_count_only_rounds_move_s_and_not_the_model_and_book_the_counts_closed_form(tmp_path, shared_data_dir):
    config = _run_config(shared_data_dir, tmp_path)
    keys = {"epsilon-budget": 100.0, "public-num-examples": True, "allow-central-user": True,
            "data-dir": str(shared_data_dir)}
    grid = InProcessGrid(config, {10 + i: node_config(i, NODES, tmp_path, **keys) for i in range(NODES)})
    history = run_server(grid, config)
    assert len(history.rounds) == ROUNDS

    q = COHORT / NODES
    z_delta = 1 / math.sqrt(Z**-2 - (2 * COUNT_NOISE) ** -2)
    theta = {k: v.detach().double().numpy() for k, v in build_model("cnn", SEED).state_dict().items()}
    replies, clip = _train_replies(grid), CLIP
    for r in range(1, ROUNDS + 1):
        rng = np.random.default_rng(derive_seed(SEED, "user-level", r))
        cohort = {str(i) for i, u in enumerate(rng.random(NODES)) if u < q}
        got = [replies.get(r, {})[c] for c in sorted(cohort, key=int)]
        assert set(replies.get(r, {})) == cohort
        assert history.rounds[r - 1].train_metrics["user_clip"] == pytest.approx(clip)
        bits = [int(c.metric_records["user"]["under-clip"]) for c in got]
        if r <= WARMUP:  # the bit and the charge leave the node, no delta
            assert all(set(c.keys()) == {protocol.PRIVACY, "user"} for c in got)
            assert history.rounds[r - 1].train_metrics["count_only"] == 1
            lr = WARMUP_LR
        else:
            for name in theta:
                total = sum((c.array_records[protocol.ARRAYS][name].numpy().astype(np.float64) for c in got),
                            np.zeros_like(theta[name]))
                total += rng.standard_normal(theta[name].size).reshape(theta[name].shape) * z_delta * clip
                theta[name] = (theta[name] + total / (q * NODES)).astype(np.float32).astype(np.float64)
            lr = CLIP_LR
        estimate = (sum(b - 0.5 for b in bits) + rng.standard_normal(1)[0] * COUNT_NOISE) / (q * NODES) + 0.5
        estimate = min(1.0, max(0.0, estimate))  # b̃ estimates a fraction: clamped to [0, 1]
        clip *= math.exp(-lr * (estimate - QUANTILE))
    assert clip < CLIP * math.exp(-WARMUP_LR * 0.25), "S came down in the count-only rounds (all bits 1 at S = 50)"
    assert [r.test_accuracy for r in history.rounds[:WARMUP]] == [history.initial["test_accuracy"]] * WARMUP, \
        "the model did not move in the count-only rounds"
    _, arrays = ServerState(tmp_path / "server").load()
    for name, value in theta.items():
        np.testing.assert_allclose(arrays[name].numpy(), value, rtol=1e-5, atol=1e-6)
    assert history.resolved["user_level"]["final_clip"] == pytest.approx(clip)

    server = PrivacyLedger.load(tmp_path / "server" / "ledger.json")
    count_round = PoissonSampledEvent(q, GaussianEvent(2 * COUNT_NOISE))  # Σ(b − ½) moves by ½ per client
    for i in range(NODES):
        cid = str(i)
        assert server.events(cid) == (count_round,) * WARMUP + (PoissonSampledEvent(q, GaussianEvent(Z)),) * \
            (ROUNDS - WARMUP)
        node = PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json")
        want = tuple(GaussianEvent(COUNT_NOISE) if r <= WARMUP else GaussianEvent(Z / 2)  # a record flips the bit
                     for r in range(1, ROUNDS + 1) if cid in replies.get(r, {}))
        assert node.events(cid) == want
    planned = plan(Federation(population=NODES, cohort=COHORT, rounds=ROUNDS, delta=1e-5, noise_multiplier=Z,
                              count_rounds=WARMUP, count_noise=COUNT_NOISE), ["user"])["modes"]["user"]
    for r, round_log in enumerate(history.rounds):  # the planner's trajectory is every client's, from the ledger
        assert list(round_log.epsilon.values()) == pytest.approx([planned["epsilon"][r]] * NODES, rel=1e-12)


def test_a_count_only_reply_carrying_a_delta_or_a_forged_charge_is_rejected():
    global_arrays = ArrayRecord({"w": Array(np.zeros((2, 2), dtype=np.float32))})
    charge = Charge("run-x/round-1/train", (GaussianEvent(COUNT_NOISE),))

    def reply(with_delta=False, events=charge.events):
        records = {protocol.PRIVACY: protocol.charge_record(Charge(charge.entry, events)),
                   "user": MetricRecord({"under-clip": 1})}
        if with_delta:
            records[protocol.ARRAYS] = ArrayRecord({"w": Array(np.zeros((2, 2), dtype=np.float32))})
        return Message(RecordDict(records), 1, MessageType.TRAIN)

    assert check_user_reply(reply(), charge, global_arrays, 1.0, count_only=True) is None
    assert "expected exactly the records" in check_user_reply(reply(with_delta=True), charge, global_arrays, 1.0,
                                                              count_only=True)
    assert "differs from the booked" in check_user_reply(reply(events=(GaussianEvent(Z / 2),)), charge,
                                                         global_arrays, 1.0, count_only=True)
    assert "expected exactly the records" in check_user_reply(reply(), charge, global_arrays, 1.0)


@pytest.mark.parametrize(("config", "message"), [
    ({"count-only": "yes", "clip-count-noise": 1.0}, "must be a bool"),
    ({"count-only": True}, "needs 'clip-count-noise'"),
    ({"count-only": True, "clip-count-noise": 0.0}, "finite and > 0"),
])
def test_a_node_refuses_a_malformed_count_only_round(config, message):
    with pytest.raises(protocol.ProtocolError, match=message):
        userlevel.read_count_only(config)


def test_a_node_given_a_malformed_count_only_round_books_nothing(tmp_path, shared_data_dir):
    class Forged(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            for m in messages:
                if protocol.CONFIG in m.content.config_records and \
                        "user-clip" in m.content.config_records[protocol.CONFIG]:
                    m.content.config_records[protocol.CONFIG]["count-only"] = "yes"
            return super().send_and_receive(messages, timeout=timeout)

    config = _run_config(shared_data_dir, tmp_path, cohort=NODES)
    keys = {"epsilon-budget": 100.0, "public-num-examples": True, "allow-central-user": True,
            "data-dir": str(shared_data_dir)}
    history = run_server(Forged(config, {10 + i: node_config(i, NODES, tmp_path, **keys) for i in range(NODES)}),
                         config)
    assert all("count-only" in reason for r in history.rounds for reason in r.failed.values())
    for i in range(NODES):
        assert PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json").events(str(i)) == ()


def test_target_epsilon_prices_the_count_only_rounds(tmp_path):
    """The calibrated z is dp-accounting's smallest 3-digit one for the W count rounds at 2σ_b
    composed with the R − W training rounds (σ_b = m/20: the run's max(m/20, z) is no less)."""
    import dp_accounting as dpa

    from server.userlevel import calibrated_noise

    population, cohort, rounds, warmup, target, delta = 200, 40, 30, 10, 3.0, 1e-5
    settings = RunSettings.from_run_config({"privacy": "user", "cohort": cohort, "rounds": rounds,
                                            "target-epsilon": target, "delta": delta, "clip-quantile": 0.5,
                                            "clip-warmup-rounds": warmup})
    q, count_noise = cohort / population, cohort / 20
    z = calibrated_noise(settings, q, cohort)

    def epsilon(noise):
        accountant = dpa.rdp.RdpAccountant()
        accountant.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(2 * count_noise)), warmup)
        accountant.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(noise)), rounds - warmup)
        return accountant.get_epsilon(delta)

    assert epsilon(z) <= target < epsilon(z - 10 ** (math.floor(math.log10(z)) - 2))
    assert z > calibrate_noise_multiplier(target, delta, q, rounds - warmup) - 1e-12  # the count is not free


@pytest.mark.parametrize(("config", "match"), [
    ({"privacy": "user", "noise-multiplier": 1.0, "clip-warmup-rounds": 2}, "clip-quantile"),
    ({"noise-multiplier": 1.0, "clip-quantile": 0.5, "clip-warmup-rounds": 2}, "privacy = 'user'"),
    ({"privacy": "user", "noise-multiplier": 1.0, "clip-quantile": 0.5, "clip-warmup-rounds": 3, "rounds": 3},
     "leave at least one"),
    ({"privacy": "user", "noise-multiplier": 1.0, "clip-quantile": 0.5, "clip-warmup-rounds": -1}, ">= 0"),
    ({"privacy": "user", "noise-multiplier": 1.0, "clip-quantile": 0.5, "clip-warmup-lr": 0.0}, "clip-warmup-lr"),
])
def test_a_bad_warmup_setting_is_refused(config, match):
    with pytest.raises(SettingsError, match=match):
        RunSettings.from_run_config(config)


def test_the_planners_user_column_prices_the_count_only_rounds_as_the_server_does():
    """σ is the server's calibrated z; ε after each round is dp-accounting's for the count
    rounds at 2σ_b (σ_b = max(m/20, z)) then the training rounds at z; the rounds afforded
    at a fixed z include the count rounds."""
    import dp_accounting as dpa

    from server.userlevel import calibrated_noise

    population, cohort, rounds, warmup, target, delta = 200, 40, 30, 10, 3.0, 1e-5
    planned = plan(Federation(population=population, cohort=cohort, rounds=rounds, delta=delta,
                              target_epsilon=target, count_rounds=warmup), ["user"])["modes"]["user"]
    settings = RunSettings.from_run_config({"privacy": "user", "cohort": cohort, "rounds": rounds,
                                            "target-epsilon": target, "delta": delta, "clip-quantile": 0.5,
                                            "clip-warmup-rounds": warmup})
    z = planned["noise_multiplier"]
    assert z == calibrated_noise(settings, cohort / population, cohort)
    q, count_noise = cohort / population, max(cohort / 20, z)
    for r in (1, warmup, warmup + 1, rounds):
        accountant = dpa.rdp.RdpAccountant()
        accountant.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(2 * count_noise)), min(r, warmup))
        if r > warmup:
            accountant.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), r - warmup)
        assert planned["epsilon"][r - 1] == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)
    assert planned["rounds_affordable"] >= rounds and planned["count_only_rounds"] == warmup
