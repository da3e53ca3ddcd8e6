"""DP-PCA (Abadi et al. 2016): the released matrix's sensitivity (Hypothesis, add/remove one
record, and reached), the noise's scale (KS against the closed form, failing at 1.2×), the
cost composed in a ledger against dp-accounting, the Poisson sample, utility at a small σ,
bad input, and ``python -m simulations.dppca`` end to end on a few thousand images.

The release is a symmetric matrix A + (G + Gᵀ)/2. Written in isometric coordinates
v(M) = (M_ii, √2·M_ij for i < j), in which ‖v(M)‖₂ = ‖M‖_F, it is the textbook Gaussian
mechanism v(A) + N(0, σ²·I): the tests check each half in those coordinates, computed here.
"""

import json
import math
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from fedpriv.algorithms.dppca import (
    SENSITIVITY,
    calibrate_pca_noise,
    check_projection,
    noisy_second_moment,
    pca_event,
    principal_projection,
    project,
    second_moment,
    unit_rows,
)
from fedpriv.privacy import Budget, PrivacyLedger, dpsgd_event
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.seeding import generator
from tests.conftest import PROJECT_ROOT
from tests.timeouts import scaled

D = 6
coordinates = st.floats(-1e3, 1e3, allow_nan=False)


def isometric(matrix: torch.Tensor) -> np.ndarray:
    """v(M): the diagonal, then √2 × the entries above it; ‖v(M)‖₂ = ‖M‖_F for symmetric M."""
    m = matrix.numpy()
    upper = np.triu_indices(len(m), k=1)
    return np.concatenate([np.diag(m), math.sqrt(2) * m[upper]])


@settings(max_examples=200, deadline=None)
@given(data=arrays(float, (4, D), elements=coordinates), extra=arrays(float, D, elements=coordinates))
def test_adding_one_record_moves_the_statistic_by_at_most_the_sensitivity(data, extra):
    before = second_moment(torch.tensor(data))
    after = second_moment(torch.tensor(np.vstack([data, extra])))
    moved = np.linalg.norm(isometric(after) - isometric(before))
    assert moved <= SENSITIVITY + 1e-9
    # every non-zero record reaches it: unit norm, and ‖x xᵀ‖_F = ‖x‖² = 1
    assert moved == pytest.approx(SENSITIVITY if np.any(extra != 0) else 0.0, abs=1e-9)


def test_the_upper_triangle_would_have_the_same_bound_reached_at_a_basis_vector():
    # the alternative (noise on the upper triangle, mirrored) releases u(A) = (A_ij, i ≤ j):
    # ‖u(x xᵀ)‖² = ½(‖x‖⁴ + Σ x_i⁴), 1 at a basis vector, 1/√2-ish at a spread-out record
    basis, spread = torch.eye(D)[:1], torch.ones(1, D)
    upper = np.triu_indices(D)
    assert np.linalg.norm(second_moment(basis).numpy()[upper]) == pytest.approx(1.0)
    assert np.linalg.norm(second_moment(spread).numpy()[upper]) == pytest.approx(math.sqrt((1 + 1 / D) / 2))


def test_unit_rows_scales_records_to_norm_one_and_keeps_zero():
    rows = unit_rows(torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-30, 0.0]]))
    assert rows.tolist() == [[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]]


def test_the_noise_has_the_stated_scale():
    # on no records the release is pure noise: in v-coordinates, i.i.d. N(0, σ²) with Δ = 1
    sigma, d = 3.0, 20
    noise = generator(0, "test-noise")
    draws = np.concatenate([isometric(noisy_second_moment(torch.empty(0, d), sigma, noise_generator=noise).matrix)
                            for _ in range(40)])
    assert len(draws) == 40 * d * (d + 1) // 2
    assert stats.kstest(draws, stats.norm(scale=sigma * SENSITIVITY).cdf).pvalue > 1e-3
    assert stats.kstest(draws, stats.norm(scale=1.2 * sigma * SENSITIVITY).cdf).pvalue < 1e-3


SECURE_ALPHA = 1e-6
"""The false-failure rate of the secure (unseeded) KS test below. Its power: N(0, σ²) and
N(0, (1.2σ)²) are D = 0.044 apart in KS distance; at 16,500 draws, p < α needs an empirical D
above 0.021 (DKW), and DKW keeps it within 0.023 of 0.044 but for 2·exp(-2·16500·0.023²) < 10⁻⁷."""


def test_the_release_is_symmetric_and_secure_mode_draws_the_same_law():
    release = noisy_second_moment(torch.empty(0, 10), 2.0, secure_mode=True)
    assert torch.equal(release.matrix, release.matrix.T)
    draws = np.concatenate([isometric(noisy_second_moment(torch.empty(0, 10), 2.0, secure_mode=True).matrix)
                            for _ in range(300)])
    assert stats.kstest(draws, stats.norm(scale=2.0).cdf).pvalue > SECURE_ALPHA
    assert stats.kstest(draws, stats.norm(scale=1.2 * 2.0).cdf).pvalue < SECURE_ALPHA  # the test can tell


def test_the_poisson_sample_keeps_each_record_with_probability_q():
    # 4,000 copies of e₁ and σ = 0: the (0, 0) entry counts the sampled records, Binomial(4000, q)
    records, q = torch.eye(3)[:1].repeat(4000, 1), 0.3
    counts = [noisy_second_moment(records, 0.0, q, sampling_generator=generator(s, "sample")).matrix[0, 0].item()
              for s in range(20)]
    assert all(c == round(c) for c in counts)
    assert abs(np.mean(counts) - 4000 * q) < 4 * math.sqrt(4000 * q * (1 - q) / 20)
    assert np.std(counts) > 0  # a fresh sample each time, not a fixed subset


def _dp_accounting_epsilon(events, delta: float) -> float:
    accountant = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    for event in events:
        accountant.compose(event)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("sample_rate", [1.0, 0.2])
def test_the_event_composes_in_a_ledger_as_dp_accounting_says(sample_rate):
    sigma_p = calibrate_pca_noise(0.3, 1e-5, sample_rate)
    event = noisy_second_moment(torch.rand(50, 4), sigma_p, sample_rate, sampling_generator=generator(0, "s"),
                                noise_generator=generator(0, "n")).event
    assert event == pca_event(sigma_p, sample_rate)
    gaussian = dp_accounting.GaussianDpEvent(sigma_p)
    reference_pca = gaussian if sample_rate == 1 else dp_accounting.PoissonSampledDpEvent(sample_rate, gaussian)
    assert _dp_accounting_epsilon([reference_pca], 1e-5) <= 0.3
    ledger = PrivacyLedger(Budget(epsilon=2.0, delta=1e-5))
    ledger.record("0", "dppca/projection", (event,))
    ledger.record("0", "dppca/train", (dpsgd_event(1.5, 0.01, 3000),))
    training = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.5)), 3000)
    assert ledger.spent("0") == pytest.approx(_dp_accounting_epsilon([reference_pca, training], 1e-5), rel=1e-6)
    assert ledger.spent("0") > _dp_accounting_epsilon([training], 1e-5)  # the PCA is not free


def test_at_a_small_sigma_the_projection_is_the_exact_principal_subspace():
    x = torch.randn(500, 8, generator=torch.Generator().manual_seed(0)) * torch.arange(8, 0, -1)
    exact = principal_projection(second_moment(x), 3)
    noisy = principal_projection(noisy_second_moment(x, 1e-4, noise_generator=generator(0, "n")).matrix, 3)
    assert torch.allclose(noisy @ noisy.T, exact @ exact.T, atol=1e-4)  # same subspace, any signs
    assert torch.allclose(exact.T @ exact, torch.eye(3), atol=1e-6)
    assert project(x, exact).shape == (500, 3)


@pytest.mark.parametrize("call, message", [
    (lambda: second_moment(torch.ones(3)), "shape"),
    (lambda: noisy_second_moment(torch.ones(2, 2), -1.0, noise_generator=generator(0, "n")), "noise_multiplier"),
    (lambda: noisy_second_moment(torch.ones(2, 2), 1.0, 0.0, noise_generator=generator(0, "n")), "sample_rate"),
    (lambda: noisy_second_moment(torch.ones(2, 2), 1.0, 1.5, noise_generator=generator(0, "n")), "sample_rate"),
    (lambda: noisy_second_moment(torch.ones(2, 2), 1.0), "noise_generator"),
    (lambda: noisy_second_moment(torch.ones(2, 2), 1.0, 0.5, noise_generator=generator(0, "n")),
     "sampling_generator"),
    (lambda: noisy_second_moment(torch.ones(2, 2), 1.0, secure_mode=True, noise_generator=generator(0, "n")),
     "no generators"),
    (lambda: (g := generator(0, "g"), noisy_second_moment(torch.ones(2, 2), 1.0, 0.5, sampling_generator=g,
                                                          noise_generator=g)), "share"),
    (lambda: principal_projection(torch.eye(4), 5), "dims"),
    (lambda: principal_projection(torch.ones(2, 3), 1), "square"),
    (lambda: project(torch.ones(2, 5), torch.ones(4, 2)), "coordinates"),
    (lambda: calibrate_pca_noise(0.0, 1e-5), "target_epsilon"),
])
def test_bad_input_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _run_command(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulations.dppca", *argv], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=scaled(600))


@pytest.mark.parametrize("argv, flag", [
    (("--epsilon", "0"), "--epsilon"),
    (("--epsilon", "2", "--pca-share", "1"), "--pca-share"),
    (("--epsilon", "2", "--pca-share", "0.1", "--pca-noise-multiplier", "7"), "--pca-noise-multiplier"),
    (("--epsilon", "2", "--dims", "0"), "--dims"),
    (("--epsilon", "2", "--data-dir", "{empty}"), "--data-dir"),
])
def test_the_command_refuses_bad_input_in_one_line(argv, flag, tmp_path):
    done = _run_command(*(arg.replace("{empty}", str(tmp_path)) for arg in argv))
    assert done.returncode == 2 and not done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and flag in done.stderr and "Traceback" not in done.stderr


def test_the_command_books_the_pca_beside_the_training_and_reports_the_ledger(shared_data_dir, tmp_path):
    from simulations import dppca as command

    out = tmp_path / "dppca.json"
    result = command.main(["--epsilon", "2", "--limit-train", "1200", "--epochs", "2", "--lot-size", "300",
                           "--data-dir", str(shared_data_dir), "--out", str(out)])
    assert json.loads(out.read_text()) == result
    entries = result["ledger"]["0"]
    assert entries["dppca/projection"] == [{"type": "gaussian", "noise_multiplier": result["pca_noise_multiplier"]}]
    training = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        result["sample_rate"], dp_accounting.GaussianDpEvent(result["noise_multiplier"])), result["steps"])
    pca = dp_accounting.GaussianDpEvent(result["pca_noise_multiplier"])
    assert result["total_epsilon"] == pytest.approx(_dp_accounting_epsilon([pca, training], 1e-5), rel=1e-6)
    assert result["total_epsilon"] <= 2.0 and result["randomness"] == "seeded"
    assert result["pca_epsilon"] == pytest.approx(_dp_accounting_epsilon([pca], 1e-5), rel=1e-6)
    assert result["pca_epsilon"] <= 0.15 * 2.0 and len(entries) == 1 + 2 and 0.1 < result["accuracy"] <= 1


def _grid(state, data_dir, budget: float = 2.0, clients: int = 2):
    from clients.classic.client_app import app
    from tests.flower.inprocess import InProcessGrid, node_config

    nodes = {i: node_config(i, clients, state, **{"epsilon-budget": budget, "randomness": "seeded", "seed": 1,
                                                  "data-dir": str(data_dir)}) for i in range(clients)}
    return InProcessGrid({}, nodes, client_app=app)


def _node_entries(state, client: int) -> dict:
    path = state / f"node{client}" / "ledger.json"
    return PrivacyLedger.load(path).entries(str(client)) if path.exists() else {}


@pytest.mark.usefixtures("task_identity")
def test_federated_nodes_book_their_release_first_and_refuse_past_their_budget(shared_data_dir, tmp_path):
    from server.classic.loops import federated_dppca

    projection, model, shares = federated_dppca(_grid(tmp_path / "rich", shared_data_dir), 0, 12.4, 1.0, 5, 784,
                                                limit_train=400)
    assert projection.shape == (784, 5) and model is None and not shares.refused
    for client in range(2):
        assert list(_node_entries(tmp_path / "rich", client).values()) == [(pca_event(12.4),)]
    poor = _grid(tmp_path / "poor", shared_data_dir, budget=0.1)  # ε(σ_p = 12.4) ≈ 0.3 > 0.1: refused
    with pytest.raises(RuntimeError, match="budget"):
        federated_dppca(poor, 0, 12.4, 1.0, 5, 784, limit_train=400)
    assert not _node_entries(tmp_path / "poor", 0)


def _dppca_request(data_dir: str | None) -> dict:
    config = {"algorithm": "dppca", "seed": 0, "step": 0, "run-key": "run-abc", "noise-multiplier": 12.4,
              "sample-rate": 1.0, "limit-train": 400}
    return config if data_dir is None else {**config, "data-dir": data_dir}


@pytest.mark.usefixtures("task_identity")
def test_a_node_reads_its_own_data_folder_never_the_one_the_server_names(shared_data_dir, tmp_path):
    from server.classic.loops import Shares, _ask

    # a folder the server names, holding an "MNIST" of its choosing (one copied image file would
    # do; an empty folder is enough to show it is never opened: the reply is the same either way)
    elsewhere = tmp_path / "server-chosen"
    (elsewhere / "MNIST" / "raw").mkdir(parents=True)
    replies = {}
    for name, named in (("plain", None), ("named", str(elsewhere))):
        shares = Shares()
        total, accepted = _ask(_grid(tmp_path / name, shared_data_dir), _dppca_request(named), {}, 784 * 784,
                               pca_event(12.4), shares)
        assert accepted == 2 and not shares.refused
        replies[name] = total
    # same node seed, same ledger ordinal: the same draws on the same (the node's own) data
    assert np.array_equal(replies["plain"], replies["named"])

    # a node whose own folder lacks MNIST refuses, before booking, even when the server names real data
    shares = Shares()
    _, accepted = _ask(_grid(tmp_path / "bare", tmp_path / "empty"), _dppca_request(str(shared_data_dir)), {},
                       784 * 784, pca_event(12.4), shares)
    assert accepted == 0 and len(shares.refused) == 2 and all("MNIST" in r for r in shares.refused.values())
    assert all(str(tmp_path / "empty") not in r for r in shares.refused.values())  # its path is its own
    assert not _node_entries(tmp_path / "bare", 0) and not _node_entries(tmp_path / "bare", 1)


def _federated_args(*extra: str):
    from simulations.dppca import build_parser

    return build_parser().parse_args(["--epsilon", "2", "--clients", "2", "--limit-train", "400", "--epochs", "2",
                                      "--lot-size", "40", "--dims", "5", *extra])


@pytest.mark.usefixtures("task_identity")
def test_federated_training_books_every_round_and_meets_epsilon_per_dp_accounting(shared_data_dir, tmp_path):
    from fedpriv.federation.classic_protocol import flat_weights
    from server.classic.loops import DppcaTraining, federated_dppca
    from simulations.dppca import pca_noise, training_plan

    args = _federated_args()
    sigma_p = pca_noise(args)
    plan = training_plan(args, 400, pca_event(sigma_p))
    q = plan.sample_rate(400)
    training = DppcaTraining(rounds=2, steps=plan.steps_per_round(400), sample_rate=q, lot_size=q * 200,
                             noise_multiplier=plan.noise_multiplier, max_grad_norm=1.0, lr=0.2)
    grid = _grid(tmp_path, shared_data_dir)
    seen = []
    projection, model, shares = federated_dppca(grid, 0, sigma_p, 1.0, 5, 784, limit_train=400, training=training,
                                                after_round=lambda r, m, p: seen.append(r))
    assert not shares.refused and seen == [1, 2] and projection.shape == (784, 5)
    # FedAvg: the model is the mean of the two nodes' last replies
    last = [reply.content.array_records["values"]["values"].numpy() for reply in grid.log[-2:]]
    assert np.allclose(flat_weights(model), np.mean(last, axis=0), atol=1e-6)
    assert not np.allclose(last[0], last[1])  # each node trained on its own share, with its own noise

    pca = dp_accounting.GaussianDpEvent(sigma_p)

    def rounds(sigma: float):
        return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            q, dp_accounting.GaussianDpEvent(sigma)), 2 * training.steps)

    spent = _dp_accounting_epsilon([pca, rounds(plan.noise_multiplier)], 1e-5)
    assert spent <= 2.0
    for client in range(2):  # the PCA, then one entry per round, all in the node's own ledger
        ledger = PrivacyLedger.load(tmp_path / f"node{client}" / "ledger.json")
        assert len(ledger.entries(str(client))) == 3
        assert ledger.spent(str(client)) == pytest.approx(spent, rel=1e-6)
    # σ is not wastefully large: 3 % less noise would overspend
    assert _dp_accounting_epsilon([pca, rounds(0.97 * plan.noise_multiplier)], 1e-5) > 2.0


def _train_request(projection: np.ndarray, weights: np.ndarray | None = None, **overrides) -> tuple[dict, dict]:
    from fedpriv.federation.classic_protocol import flat_weights
    from fedpriv.models import build_model

    dims = projection.shape[1] if projection.ndim == 2 else 5
    weights = flat_weights(build_model("mlp", 0, in_features=dims)) if weights is None else weights
    config = {"algorithm": "dppca-train", "seed": 0, "step": 0, "run-key": "run-abc", "limit-train": 400,
              "noise-multiplier": 4.0, "sample-rate": 0.1, "steps": 2, "lot-size": 20.0, "max-grad-norm": 1.0,
              "lr": 0.1, **overrides}
    return config, {"projection": projection, "weights": weights}


_orthonormal = np.linalg.qr(np.random.default_rng(0).normal(size=(784, 5)))[0]
_nan = _orthonormal.copy()
_nan[3, 2] = np.nan


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("projection, weights, reason, overrides", [
    (_orthonormal[:700], None, "shape", None),
    (_orthonormal[:, 0], None, "shape", None),
    (_nan, None, "finite", None),
    (3 * _orthonormal, None, "orthonormal", None),
    (np.ones((784, 5)), None, "orthonormal", None),
    (_orthonormal, np.zeros(10), "weights", None),
    (_orthonormal, None, "budget", {"noise-multiplier": 0.0}),  # a noiseless round costs ε = ∞
    (_orthonormal, None, "limit-train", {"limit-train": -1}),
    (_orthonormal, None, "steps", {"steps": 0}),
])
def test_an_untrusted_projection_or_request_is_refused_before_booking(shared_data_dir, tmp_path, projection,
                                                                      weights, reason, overrides):
    from server.classic.loops import Shares, _ask

    config, arrays = _train_request(projection, weights, **(overrides or {}))
    shares = Shares()
    _, accepted = _ask(_grid(tmp_path, shared_data_dir), config, arrays, len(arrays["weights"]),
                       dpsgd_event(4.0, 0.1, 2), shares)
    assert accepted == 0 and len(shares.refused) == 2 and all(reason in r for r in shares.refused.values())
    assert not _node_entries(tmp_path, 0) and not _node_entries(tmp_path, 1)


@pytest.mark.usefixtures("task_identity")
def test_a_valid_projection_trains_and_books_the_round(shared_data_dir, tmp_path):
    from server.classic.loops import Shares, _ask

    config, arrays = _train_request(_orthonormal)
    shares = Shares()
    _, accepted = _ask(_grid(tmp_path, shared_data_dir), config, arrays, len(arrays["weights"]),
                       dpsgd_event(4.0, 0.1, 2), shares)
    assert accepted == 2 and not shares.refused
    assert list(_node_entries(tmp_path, 0).values()) == [(dpsgd_event(4.0, 0.1, 2),)]


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("algorithm", ["dppca", "dppca-train"])
def test_a_node_has_booked_its_release_when_it_reads_its_images(shared_data_dir, tmp_path, monkeypatch, algorithm):
    # Whatever happens after the read (a crash, a kill), the release is already in the
    # node's durable ledger: the ledger is read at the moment each node reads its images.
    import clients.classic.algorithms as classic_algorithms
    from server.classic.loops import Shares, _ask

    real_share, booked_at_read = classic_algorithms._mnist_share, []

    def recording_share(node, *args):
        booked_at_read.append((node.client, list(_node_entries(tmp_path, node.client).values())))
        return real_share(node, *args)

    monkeypatch.setattr(classic_algorithms, "_mnist_share", recording_share)
    if algorithm == "dppca":
        config, arrays, size, event = _dppca_request(None), {}, 784 * 784, pca_event(12.4)
    else:
        (config, arrays), event = _train_request(_orthonormal), dpsgd_event(4.0, 0.1, 2)
        size = len(arrays["weights"])
    shares = Shares()
    _, accepted = _ask(_grid(tmp_path, shared_data_dir), config, arrays, size, event, shares)
    assert accepted == 2 and not shares.refused
    assert booked_at_read == [(0, [(event,)]), (1, [(event,)])]


@pytest.mark.parametrize("projection, message", [
    (np.eye(784)[:, :0], "shape"),
    (np.eye(10), "shape"),
    (np.full((784, 2), np.inf), "finite"),
    (2 * np.eye(784)[:, :3], "orthonormal"),
])
def test_check_projection_refuses_what_is_not_an_orthonormal_basis(projection, message):
    with pytest.raises(ValueError, match=message):
        check_projection(projection, 784)
    assert check_projection(_orthonormal, 784).dtype == torch.float32
