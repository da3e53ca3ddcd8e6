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
import torch
from dp_accounting.rdp import RdpAccountant
from flwr.app import Message, RecordDict

import clients.userlevel_distributed as node_side
from clients.client_app import app as real_app
from clients.secure_sum import answer_stage, is_secure_sum
from fedpriv.models import build_model
from fedpriv.privacy import PrivacyLedger, epsilon_of
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.privacy.events import DistributedDiscreteGaussianEvent, PoissonSampledEvent
from fedpriv.secagg import Requirements
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
            "seed": 11 + i, "allow-distributed": True, **policy}


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
            assert node.spent(str(i)) > epsilon_of(dp_accounting_free_gaussian(Z / 2, took_part[str(i)]), DELTA)


def dp_accounting_free_gaussian(multiplier: float, count: int):
    """Central mode's node event for the same rounds: the lattice's inflation makes the
    distributed one (slightly) dearer, never cheaper."""
    from fedpriv.privacy import GaussianEvent, SelfComposedEvent

    return SelfComposedEvent(GaussianEvent(multiplier), count)
