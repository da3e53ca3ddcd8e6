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

from fedpriv.algorithms.dppca import (SENSITIVITY, calibrate_pca_noise, noisy_second_moment, pca_event,
                                      principal_projection, project, second_moment, unit_rows)
from fedpriv.privacy import Budget, PrivacyLedger, dpsgd_event
from fedpriv.privacy.accountants.rdp import ORDERS
from fedpriv.seeding import generator
from tests.conftest import PROJECT_ROOT

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


def test_the_release_is_symmetric_and_secure_mode_draws_the_same_law():
    release = noisy_second_moment(torch.empty(0, 10), 2.0, secure_mode=True)
    assert torch.equal(release.matrix, release.matrix.T)
    draws = np.concatenate([isometric(noisy_second_moment(torch.empty(0, 10), 2.0, secure_mode=True).matrix)
                            for _ in range(20)])
    assert stats.kstest(draws, stats.norm(scale=2.0).cdf).pvalue > 1e-3


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
    (lambda: second_moment(torch.tensor([[1.0, float("nan")]])), "finite"),
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
                          text=True, timeout=120)


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
    assert result["total_epsilon"] <= 2.0
    assert result["pca_epsilon"] == pytest.approx(_dp_accounting_epsilon([pca], 1e-5), rel=1e-6)
    assert result["pca_epsilon"] <= 0.15 * 2.0 and len(entries) == 1 + 2 and 0.1 < result["accuracy"] <= 1


@pytest.mark.usefixtures("task_identity")
def test_federated_nodes_book_their_release_first_and_refuse_past_their_budget(shared_data_dir, tmp_path):
    from clients.classic_app import app
    from server.classic import federated_dppca
    from tests.flower.inprocess import InProcessGrid, node_config

    def grid(budget: float, state):
        nodes = {i: node_config(i, 2, state, **{"epsilon-budget": budget, "randomness": "seeded", "seed": 1})
                 for i in range(2)}
        return InProcessGrid({}, nodes, client_app=app)

    rich = grid(2.0, tmp_path / "rich")
    projection, shares = federated_dppca(rich, 0, 12.4, 1.0, 5, 784, str(shared_data_dir), 400)
    assert projection.shape == (784, 5) and not shares.refused
    for client in range(2):
        entries = PrivacyLedger.load(tmp_path / "rich" / f"node{client}" / "ledger.json").entries(str(client))
        assert list(entries.values()) == [(pca_event(12.4),)]
    poor = grid(0.1, tmp_path / "poor")  # ε(σ_p = 12.4) ≈ 0.3 > 0.1: refused, nothing booked
    with pytest.raises(RuntimeError, match="budget"):
        federated_dppca(poor, 0, 12.4, 1.0, 5, 784, str(shared_data_dir), 400)
    assert not (tmp_path / "poor" / "node0" / "ledger.json").exists() or not PrivacyLedger.load(
        tmp_path / "poor" / "node0" / "ledger.json").entries("0")
