"""Distributed user-level DP-FedAvg end to end, in process (``server.run`` with the real
ClientApp and SecAgg+): the new global model is the initial one plus, each round, the
modular sum of the cohort's vectors, centred, over the scale and the expected cohort,
recomputed here; each vector is the node's clipped delta rounded to the nearest lattice
point plus a discrete Gaussian share of the size its own policy guarantees (measured);
the server books every client the nominal event and each node its records' view, both
checked against dp-accounting's Gaussian at the lattice's effective multiplier; a server
that packs the cohort with its own nodes cannot shrink an honest node's share; a node
without ``allow-distributed`` refuses and books nothing."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from flwr.app import Message, RecordDict

import clients.userlevel_distributed as node_side
from clients.client_app import app as real_app
from clients.secure_sum import answer_stage, is_secure_sum
from fedpriv.models import build_model
from fedpriv.privacy import PrivacyLedger
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.privacy.events import DistributedDiscreteGaussianEvent, PoissonSampledEvent
from fedpriv.secagg import Requirements, Vector
from fedpriv.seeding import derive_seed
from server.run import run_server
from server.state import ServerState
from tests.flower.inprocess import InProcessGrid, node_config

pytestmark = pytest.mark.usefixtures("task_identity")

SEED, Z, CLIP, DELTA = 7, 1.0, 0.05, 1e-5
DIMENSION = sum(t.numel() for t in build_model("cnn", SEED).state_dict().values())


def _run_config(data_dir, state, nodes, cohort, rounds, **extra):
    return {"rounds": rounds, "min-clients": nodes, "limit-train": 60, "limit-test": 40, "model": "cnn",
            "data-dir": str(data_dir), "state-dir": str(state / "server"), "privacy": "user",
            "user-noise": "distributed", "cohort": cohort, "user-clip": CLIP, "noise-multiplier": Z,
            "server-randomness": "seeded", "seed": SEED, "lot-size": 10, "lr": 0.1, "epsilon-budget": 100.0, **extra}


def _policy(data_dir, i, **policy):
    return {"epsilon-budget": 100.0, "public-num-examples": True, "data-dir": str(data_dir), "randomness": "seeded",
            "seed": 11 + i, "allow-distributed": True, "trust-server-cohort": True, **policy}


class Spy:
    """Each node's float delta, rounded sum and vector, by (node seed stream) call order."""

    def __init__(self, monkeypatch):
        self.rows, self.totals, self.vectors = [], [], []
        rounded_sum, noised_vector = node_side.rounded_sum, node_side.noised_vector

        def spy_rounded(rows, lattice, generator):
            self.rows.append(rows.clone().numpy()[0])
            return rounded_sum(rows, lattice, generator)

        def spy_noised(total, lattice, share, generator):
            vector = noised_vector(total, lattice, share, generator)
            self.totals.append(total.copy())
            self.vectors.append((vector, lattice, share))
            return vector

        monkeypatch.setattr(node_side, "rounded_sum", spy_rounded)
        monkeypatch.setattr(node_side, "noised_vector", spy_noised)


def _centred(values: np.ndarray, modulus: int) -> np.ndarray:
    values = np.mod(values.astype(object), modulus).astype(np.int64)
    return np.where(values >= modulus // 2, values - modulus, values)


def _nearest_sensitivity(clip_units: float) -> float:
    """Δ₂ of nearest rounding: each coordinate moves by ≤ ½ (triangle inequality), + float slack."""
    return clip_units * (1 + 2.0**-30) + math.sqrt(DIMENSION) / 2


def _dpa(events) -> float:
    acc = RdpAccountant(orders=list(ORDERS))
    for event in events:
        acc.compose(event)
    return acc.get_epsilon(DELTA)


def test_the_model_moves_by_the_decoded_noisy_sum_and_every_ledger_books_its_claim(
        tmp_path, shared_data_dir, monkeypatch):
    nodes, cohort, rounds = 4, 3, 2
    config = _run_config(shared_data_dir, tmp_path, nodes, cohort, rounds)
    policies = {10 + i: node_config(i, nodes, tmp_path, **_policy(shared_data_dir, i, **{"min-cohort": 2}))
                for i in range(nodes)}
    spy = Spy(monkeypatch)
    grid = InProcessGrid(config, policies)
    history = run_server(grid, config)
    resolved = history.resolved["user_level"]
    scale, bits = resolved["lattice_scale"], resolved["modulus_bits"]
    assert resolved["user_noise"] == "distributed" and resolved["dimension"] == DIMENSION
    c = CLIP * scale
    sensitivity = _nearest_sensitivity(c)
    assert resolved["sensitivity"] == pytest.approx(sensitivity, rel=1e-12)
    assert sensitivity / c <= 1.001  # the lattice is fine: the rounding inflates S by ≤ 0.1 %

    q = cohort / nodes
    theta = {k: v.detach().double().numpy() for k, v in build_model("cnn", SEED).state_dict().items()}
    took_part = {str(i): 0 for i in range(nodes)}
    calls = 0
    for r in range(1, rounds + 1):
        rng = np.random.default_rng(derive_seed(SEED, "user-level", r))
        sampled = [str(i) for i, u in enumerate(rng.random(nodes)) if u < q]
        assert history.rounds[r - 1].participants == sampled, "the cohort is the seeded Poisson draw"
        if len(sampled) < 2:  # below every node's min-cohort: refused, nothing stepped
            assert history.rounds[r - 1].discarded
            continue
        assert history.rounds[r - 1].survivors == sampled
        vectors = []
        for cid in sampled:
            rows, total = spy.rows[calls], spy.totals[calls]
            vector, lattice, share = spy.vectors[calls]
            calls += 1
            took_part[cid] += 1
            assert np.linalg.norm(rows) <= CLIP * (1 + 1e-9), "the delta is clipped to S"
            np.testing.assert_array_equal(total, np.round(rows * scale).astype(np.int64))
            assert np.linalg.norm(total) <= sensitivity
            # each node alone: z·S·scale/√2 (its policy's min-cohort 2), measured
            assert share == pytest.approx(Z * c / math.sqrt(2), rel=1e-12)
            noise = _centred(vector.astype(np.int64) - total, 1 << bits)
            assert abs(noise.mean()) < 5 * share / math.sqrt(DIMENSION)
            assert noise.var() == pytest.approx(share**2, rel=0.05)
            vectors.append(vector)
        summed = _centred(np.sum(np.stack(vectors).astype(object), axis=0), 1 << bits).astype(np.float64)
        mean, offset = summed / scale / (q * nodes), 0
        for name, value in theta.items():
            part = mean[offset:offset + value.size].reshape(value.shape)
            offset += value.size
            theta[name] = (value + part).astype(np.float32).astype(np.float64)
    assert calls == len(spy.vectors)
    _, arrays = ServerState(tmp_path / "server").load()
    for name, value in theta.items():
        np.testing.assert_allclose(arrays[name].numpy(), value, rtol=1e-6, atol=1e-7)

    # the population ledger: every client, every round, the nominal ⌊m⌋ = 3 shares carrying z·c
    server = PrivacyLedger.load(tmp_path / "server" / "ledger.json")
    nominal = PoissonSampledEvent(q, DistributedDiscreteGaussianEvent(Z * c / math.sqrt(3), 3, sensitivity,
                                                                      DIMENSION))
    gaussian = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(Z * c / sensitivity))
    for i in range(nodes):
        assert server.events(str(i)) == (nominal,) * rounds
        assert history.final_epsilon()[str(i)] == pytest.approx(_dpa([gaussian] * rounds), rel=1e-6)
        # a node: its records' view, 2 shares (its policy), sensitivity 2Δ₂, each round it took part in
        node = PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json")
        own = DistributedDiscreteGaussianEvent(Z * c / math.sqrt(2), 2, 2 * sensitivity, DIMENSION)
        assert node.events(str(i)) == (own,) * took_part[str(i)]
        if took_part[str(i)]:
            expected = _dpa([dp_accounting.GaussianDpEvent(Z * c / (2 * sensitivity))] * took_part[str(i)])
            assert node.spent(str(i)) == pytest.approx(expected, rel=1e-6)
            # central mode's Gaussian(z/2) for the same rounds: the rounding's inflation makes
            # the distributed booking (slightly) dearer, never cheaper
            assert node.spent(str(i)) >= _dpa([dp_accounting.GaussianDpEvent(Z / 2)] * took_part[str(i)])
    assert calls == 7  # rounds of 3 and 4 clients (the seeded draws)


QUANTILE, CLIP_LR, COUNT_NOISE, START_CLIP = 0.5, 0.2, 2.0, 0.5


def test_adaptive_clipping_rides_the_bit_as_one_more_coordinate_and_books_andrew_et_als_split(
        tmp_path, shared_data_dir, monkeypatch):
    """Each vector's last coordinate (before noise) is (2b − 1)·k, k = round(z_Δ·c/(2σ_b));
    S follows Andrew et al.'s step from the decoded count / (2k); each round's events carry
    sensitivity √(Δ₂² + k²) on d + 1 coordinates, whose multiplier z_Δ·c/√(Δ₂² + k²) is z
    up to the rounding's inflation, as the split promises."""
    nodes, cohort, rounds = 4, 3, 2
    config = _run_config(shared_data_dir, tmp_path, nodes, cohort, rounds, **{
        "clip-quantile": QUANTILE, "clip-lr": CLIP_LR, "clip-count-noise": COUNT_NOISE, "user-clip": START_CLIP})
    policies = {10 + i: node_config(i, nodes, tmp_path, **_policy(shared_data_dir, i, **{"min-cohort": 2}))
                for i in range(nodes)}
    spy = Spy(monkeypatch)
    history = run_server(InProcessGrid(config, policies), config)
    z_delta = 1 / math.sqrt(Z**-2 - (2 * COUNT_NOISE) ** -2)  # Andrew et al. 2021, Theorem 1
    q, clip, calls, bits = cohort / nodes, START_CLIP, 0, []
    theta = {k: v.detach().double().numpy() for k, v in build_model("cnn", SEED).state_dict().items()}
    server = PrivacyLedger.load(tmp_path / "server" / "ledger.json")
    node_events: dict[str, list] = {str(i): [] for i in range(nodes)}
    for r in range(1, rounds + 1):
        assert history.rounds[r - 1].train_metrics["user_clip"] == pytest.approx(clip, rel=1e-12)
        sampled = history.rounds[r - 1].participants
        vectors = []
        for cid in sampled:
            rows, total = spy.rows[calls], spy.totals[calls]
            vector, lattice, share = spy.vectors[calls]
            calls += 1
            assert lattice.dimension == DIMENSION + 1 and lattice.max_grad_norm == pytest.approx(clip, rel=1e-12)
            c = clip * lattice.scale
            sensitivity = c * (1 + 2.0**-30) + math.sqrt(DIMENSION + 1) / 2
            k = round(z_delta * c / (2 * COUNT_NOISE))
            under = np.linalg.norm(rows) < clip * (1 - 1e-9)  # clipped deltas sit on the sphere
            assert total[-1] == (1 if under else -1) * k
            bits.append(under)
            np.testing.assert_array_equal(total[:-1], np.round(rows * lattice.scale).astype(np.int64))
            assert share == pytest.approx(z_delta * c / math.sqrt(2), rel=1e-12)
            combined = math.hypot(sensitivity, k)
            node_events[cid].append(DistributedDiscreteGaussianEvent(share, 2, 2 * combined, DIMENSION + 1))
            assert z_delta * c / combined == pytest.approx(Z, rel=2e-3)  # the split: one Gaussian of z
            vectors.append(vector)
        summed = _centred(np.sum(np.stack(vectors).astype(object), axis=0), 1 << lattice.modulus_bits)
        for i in range(nodes):
            booked = server.events(str(i))[r - 1]
            assert booked.sample_rate == q
            _same(booked.event, DistributedDiscreteGaussianEvent(z_delta * c / math.sqrt(3), 3, combined,
                                                                 DIMENSION + 1))
        mean, offset = summed[:-1].astype(np.float64) / lattice.scale / (q * nodes), 0
        for name, value in theta.items():
            part = mean[offset:offset + value.size].reshape(value.shape)
            offset += value.size
            theta[name] = (value + part).astype(np.float32).astype(np.float64)
        estimate = (float(summed[-1]) / (2 * k)) / (q * nodes) + 0.5
        estimate = min(1.0, max(0.0, estimate))  # b̃ estimates a fraction: clamped to [0, 1]
        clip *= math.exp(-CLIP_LR * (estimate - QUANTILE))
    assert calls == 7 and set(bits) == {True, False}, "both kinds of client were counted"
    assert history.resolved["user_level"]["final_clip"] == pytest.approx(clip, rel=1e-12)
    _, arrays = ServerState(tmp_path / "server").load()
    for name, value in theta.items():
        np.testing.assert_allclose(arrays[name].numpy(), value, rtol=1e-6, atol=1e-7)
    for i in range(nodes):
        booked = PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json").events(str(i))
        assert len(booked) == len(node_events[str(i)])
        for event, expected in zip(booked, node_events[str(i)], strict=True):
            _same(event, expected)


def _same(event: DistributedDiscreteGaussianEvent, expected: DistributedDiscreteGaussianEvent) -> None:
    """Equal shares and dimension, and sizes equal up to float rounding (z_Δ computed apart)."""
    assert (event.shares, event.dimension) == (expected.shares, expected.dimension)
    assert event.noise_stddev == pytest.approx(expected.noise_stddev, rel=1e-12)
    assert event.sensitivity == pytest.approx(expected.sensitivity, rel=1e-12)


HONEST, SYBILS = 3, 2


def _noiseless(msg: Message, context, stage) -> tuple[Vector, RecordDict]:
    """The server's node's vector: zeros, under the round's settings as the honest nodes compute them."""
    request, _ = node_side.parse_delta(msg, context, stage)  # checked as an honest node checks it; nothing booked
    return Vector(np.zeros(stage.dimension, dtype=np.uint64), request.settings), RecordDict()


def _sybil_app(honest: int):
    """The real ClientApp for the first ``honest`` nodes; the server's own nodes (the rest)
    answer QUERY as real nodes, and every secure-sum stage with no noise at all (zeros)."""
    def app(msg: Message, context) -> Message:
        if context.node_id - 10 < honest or not is_secure_sum(msg):
            return real_app(msg, context)
        content = answer_stage(msg, context, Requirements(min_cohort=1, min_survivors=1, max_colluders=0), _noiseless)
        return Message(content, reply_to=msg)
    return app


def test_a_server_packing_the_cohort_with_its_own_nodes_cannot_shrink_an_honest_nodes_share(
        tmp_path, shared_data_dir, monkeypatch):
    """The server claims a cohort of 5 (and a population of 5, all sampled: q = 1), two of them
    its own nodes that add no noise. Each honest node's policy guarantees
    min-cohort 5 − max-colluders 2 = 3 honest shares: its share is z·S·scale/√3, measured on
    what it sends, whatever the cohort it is shown; its ledger books that share and 3 shares;
    and the 3 honest shares alone carry the variance (z·S·scale)² its booking assumes. A node
    that sized its share on the cohort it sees (5) would send z·S·scale/√5."""
    nodes = HONEST + SYBILS
    config = _run_config(shared_data_dir, tmp_path, nodes, nodes, 1)
    policy = {"min-cohort": nodes, "max-colluders": SYBILS}
    configs = {10 + i: node_config(i, nodes, tmp_path, **_policy(shared_data_dir, i, **policy)) for i in range(nodes)}
    spy = Spy(monkeypatch)
    history = run_server(InProcessGrid(config, configs, client_app=_sybil_app(HONEST)), config)
    (round_log,) = history.rounds
    assert round_log.survivors == [str(i) for i in range(nodes)], "the packed cohort's sum was unmasked"
    assert len(spy.vectors) == HONEST
    resolved = history.resolved["user_level"]
    c, bits = CLIP * resolved["lattice_scale"], resolved["modulus_bits"]
    total_variance = 0.0
    for i, (total, (vector, _, _)) in enumerate(zip(spy.totals, spy.vectors, strict=True)):
        noise = _centred(vector.astype(np.int64) - total, 1 << bits)
        measured = float(noise.var())
        # its policy's worst case, not the 5 keys it was shown (z·c/√5 would be 40 % less variance)
        assert measured == pytest.approx((Z * c) ** 2 / (nodes - SYBILS), rel=0.05)
        assert measured > 1.3 * (Z * c) ** 2 / nodes
        total_variance += measured
        (booked,) = PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json").events(str(i))
        assert booked.shares == nodes - SYBILS
        assert booked.noise_stddev**2 == pytest.approx(measured, rel=0.05)
    assert total_variance >= 0.95 * (Z * c) ** 2  # the honest shares alone carry the booked noise
    for i in range(HONEST, nodes):  # the server's own nodes booked nothing: they never trained
        assert PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json").events(str(i)) == ()


@pytest.mark.parametrize("policy", [{"allow-distributed": False},
                                    {"allow-distributed": False, "allow-central-user": True}])
def test_a_node_without_allow_distributed_refuses_and_books_nothing(tmp_path, shared_data_dir, policy):
    """Not even a node that trusts a central server (``allow-central-user``) takes part:
    distributed rounds need their own consent."""
    nodes = 3
    config = _run_config(shared_data_dir, tmp_path, nodes, nodes, 1)
    configs = {10 + i: node_config(i, nodes, tmp_path, **_policy(shared_data_dir, i, **policy)) for i in range(nodes)}
    history = run_server(InProcessGrid(config, configs), config)
    (round_log,) = history.rounds
    assert round_log.discarded
    assert all("allow-distributed" in reason for reason in round_log.failed.values())
    assert len(round_log.failed) == nodes
    _, arrays = ServerState(tmp_path / "server").load()
    initial = build_model("cnn", SEED).state_dict()
    assert all(np.array_equal(arrays[k].numpy(), v.numpy()) for k, v in initial.items()), "nothing stepped"
    for i in range(nodes):
        assert PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json").events(str(i)) == ()


@pytest.mark.parametrize(("extra", "message"), [({"clip-quantile": 0.5, "noise-multiplier": -1, "target-epsilon": 3.0},
                                                  "needs noise-multiplier"),
                                                 ({"privacy": "local"}, "privacy = 'local' does not use it")])
def test_a_calibrated_adaptive_or_a_record_level_mode_with_distributed_user_noise_is_refused(extra, message):
    from fedpriv.federation.settings import RunSettings, SettingsError

    with pytest.raises(SettingsError, match=message):
        RunSettings.from_run_config({"privacy": "user", "user-noise": "distributed", "noise-multiplier": 1.0,
                                     **extra})


def test_the_planners_distributed_user_level_column_is_dp_accountings_gaussian_at_the_lattices_multiplier():
    """z given: ε per round is the Poisson-sampled Gaussian of z·c/Δ₂ (Δ₂ of nearest rounding
    for the default model's d, c = scale); z calibrated: the smallest 3-digit share whose
    rounds end at the target, so one unit less in the share's third digit overshoots."""
    from fedpriv.distributed.lattice import fine_scale
    from fedpriv.planning import Federation, plan
    from fedpriv.training import default_plan

    d = sum(t.numel() for t in build_model(default_plan("mnist").model, 0).state_dict().values())
    c = fine_scale(1.0, d, rounding="nearest")
    z_eff = 1.1 * c / (c * (1 + 2.0**-30) + math.sqrt(d) / 2)
    fed = Federation(population=1000, cohort=100, rounds=20, delta=DELTA, noise_multiplier=1.1)
    column = plan(fed, ["user-distributed"])["modes"]["user-distributed"]
    assert column["noise_multiplier"] == 1.1 and column["sample_rate"] == 0.1
    for r in (1, 7, 20):
        sampled = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z_eff))
        assert column["epsilon"][r - 1] == pytest.approx(_dpa([sampled] * r), rel=1e-6)
    calibrated = plan(Federation(population=1000, cohort=100, rounds=20, delta=DELTA, target_epsilon=3.0),
                      ["user-distributed"])["modes"]["user-distributed"]
    assert calibrated["epsilon"][-1] <= 3.0
    z = calibrated["noise_multiplier"]
    share = z * c / math.sqrt(100)
    lower = float(f"{share:.3g}") - 10 ** (math.floor(math.log10(share)) - 2)
    cheaper = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(
        lower * math.sqrt(100) / (c * (1 + 2.0**-30) + math.sqrt(d) / 2)))
    assert _dpa([cheaper] * 20) > 3.0


def test_the_simulations_flag_gives_its_nodes_allow_distributed_and_half_the_cohort_not_central_trust(tmp_path):
    from simulations._federated import build_parser, simulated_node_policy
    from simulations._run_config import run_config_overrides

    args = build_parser("mnist").parse_args(["--clients", "100", "--privacy", "user", "--user-noise", "distributed",
                                             "--cohort", "21", "--noise-multiplier", "1.0"])
    run_config = {"delta": 1e-5, "seed": 0, "fraction-evaluate": 0.0, **run_config_overrides(args, "mnist")}
    assert run_config["user-noise"] == "distributed"
    policy = simulated_node_policy(run_config, tmp_path, clients=100)
    assert (policy["allow-distributed"], policy["min-cohort"], policy["allow-central-user"]) == (True, 11, False)
    central = simulated_node_policy({**run_config, "user-noise": "central"}, tmp_path, clients=100)
    assert central["allow-central-user"] and "allow-distributed" not in central


def test_a_round_config_whose_vector_the_secure_sum_cannot_take_is_refused_before_booking(
        tmp_path, shared_data_dir, monkeypatch):
    """A server that names σ_b (a bit coordinate) in a secure sum of d coordinates: each node
    refuses before it books, instead of booking and then failing."""
    from fedpriv.federation import userlevel
    from server.userlevel_distributed import DistributedUserLevel

    honest = DistributedUserLevel.train_config
    monkeypatch.setattr(DistributedUserLevel, "train_config",
                        lambda self, rnd, a: {**honest(self, rnd, a), userlevel.COUNT_NOISE: COUNT_NOISE})
    nodes = 3
    config = _run_config(shared_data_dir, tmp_path, nodes, nodes, 1)
    configs = {10 + i: node_config(i, nodes, tmp_path, **_policy(shared_data_dir, i)) for i in range(nodes)}
    history = run_server(InProcessGrid(config, configs), config)
    (round_log,) = history.rounds
    assert round_log.discarded and len(round_log.failed) == nodes
    for i in range(nodes):
        assert PrivacyLedger.load(tmp_path / f"node{i}" / "ledger.json").events(str(i)) == ()
