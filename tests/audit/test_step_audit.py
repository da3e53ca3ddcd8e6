"""The white-box step audit (``fedpriv.audit.steps``): its bound has the coverage it states
(against synthetic Gaussian observations, an independent reference), and driving the real
engine it flags a σ/2 noise bug and a 2C clipping bug and not a correct engine.

Family-wise α: the three engine tests run at the audit's α = 1e-4 each and are seeded; over
fresh seeds a correct engine is flagged with probability ≤ 1e-4 and the bugs are missed with
probability under 1e-6 each (docs/audit.md, measured at the defaults), so the three together
fail a correct implementation with probability ≤ 1.1e-4. The coverage test is seeded too."""

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedpriv.audit.bugs import EngineBug
from fedpriv.audit.canaries import CanaryModel, with_canaries
from fedpriv.audit.steps import Observations, StepAudit, audit_steps, bound
from fedpriv.data import load_dataset
from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.models import build_model, model_inputs
from fedpriv.seeding import generator

SIGMA = 1.89
"""σ of ε = 2 at q = 0.1 over 50 steps (the command's default claim)."""


def _synthetic(rng, n, sigma, shift=1.0, noise=None):
    noise = sigma if noise is None else noise
    return Observations(rng.normal(shift, noise, n), rng.normal(0.0, noise, 4 * n))


def test_the_bound_covers_the_truth_at_its_confidence():
    # 2,000 audits of an exact Gaussian mechanism at α = 0.05: the claim is rejected in at most
    # 5 % of them (with a binomial margin of 3 standard deviations), a twice-as-sharp one always
    rng = np.random.default_rng(0)
    rejected = sum(bound(_synthetic(rng, 200, SIGMA), 1 / SIGMA, 0.05).flagged for _ in range(2000))
    assert rejected <= 2000 * 0.05 + 3 * math.sqrt(2000 * 0.05 * 0.95)
    assert all(bound(_synthetic(rng, 200, SIGMA, noise=SIGMA / 2), 1 / SIGMA, 0.05).flagged for _ in range(100))
    assert all(bound(_synthetic(rng, 200, SIGMA, shift=2.0), 1 / SIGMA, 0.05).flagged for _ in range(100))
    # more noise than claimed (more private) is never a finding
    assert not any(bound(_synthetic(rng, 200, SIGMA, noise=2 * SIGMA), 1 / SIGMA, 0.05).flagged for _ in range(100))


def test_the_bound_is_the_closed_form():
    seen = Observations(np.array([1.0, 3.0, 2.0]), np.array([1.0, -1.0, 2.0, 0.0]))
    result = bound(seen, 0.5, 0.1)

    assert result.noise_upper == pytest.approx(math.sqrt(6.0 / stats.chi2.ppf(0.05, 4)))
    assert result.shift_lower == pytest.approx(2.0 - stats.t.ppf(0.95, 2) * 1.0 / math.sqrt(3))
    assert result.mu_lower == pytest.approx(max(0.0, result.shift_lower) / result.noise_upper)
    assert result.mu_claimed == 0.5


@pytest.mark.parametrize("bug", [EngineBug(clip_scale=2.0), EngineBug(noise_scale=0.5)])
def test_a_bug_is_made_by_wrapping_the_config(bug):
    # one noiseless step of the real engine: a canary moves by exactly clip_scale·C / divisor,
    # and the noise the engine draws is noise_scale·σ·C for the claimed C
    config = bug.config(DPSGDConfig(noise_multiplier=2.0, max_grad_norm=0.5, sample_rate=1.0))
    assert config.noise_std == pytest.approx(bug.noise_scale * 2.0 * 0.5)
    assert EngineBug().config(config) is config
    model = CanaryModel(build_model("mlp", 0), (1, 28, 28), 2, 10, 0.5)
    x, y, _ = with_canaries(torch.rand(3, 1, 28, 28), torch.randint(0, 10, (3,)), torch.tensor([True, False]))
    silent = bug.config(DPSGDConfig(noise_multiplier=0.0, max_grad_norm=0.5, sample_rate=1.0))
    train_dpsgd(model, x, y, config=silent, steps=1, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                sampling_generator=generator(0, "s"), expected_lot_size=10.0)
    assert model.canary_weights()[0].item() == pytest.approx(bug.clip_scale * 0.5 / 10.0, rel=1e-6)
    assert model.canary_weights()[1] == 0


@pytest.fixture(scope="module")
def mnist(shared_data_dir):
    data = load_dataset("mnist", str(shared_data_dir), train=True, limit=100)
    return model_inputs("cnn", data.features, cache_dir=False), data.labels


def _audit(mnist, bug, clients=None, batch=20):
    # 32 canaries, 20 steps of 20 real examples: 320 observations with the canary, about
    # 100·σ² / 1.1 (the default's power at σ = 1.89)
    setup = StepAudit(noise_multiplier=SIGMA, canaries=32, steps=20, batch=batch, bug=bug, clients=clients)
    return audit_steps(setup, *mnist, sample_rate=0.1, run_steps=50, delta=1e-5)


def test_a_correct_engine_is_not_flagged(mnist):
    result = _audit(mnist, EngineBug())
    assert not result["flagged"] and result["mu_lower_bound"] <= result["mu_claimed"]
    assert result["noise_multiplier_estimate"] == pytest.approx(SIGMA, rel=0.1)
    assert result["clipped_norm_estimate"] == pytest.approx(1.0, abs=0.5)
    assert result["confidence"] == 1 - 1e-4


def test_half_the_noise_is_flagged(mnist):
    result = _audit(mnist, EngineBug(noise_scale=0.5))
    assert result["flagged"] and result["noise_multiplier_upper_bound"] < SIGMA
    assert result["epsilon_at_lower_bound"] > 2.0


def test_clipping_at_twice_the_bound_is_flagged(mnist):
    result = _audit(mnist, EngineBug(clip_scale=2.0))
    assert result["flagged"] and result["clipped_norm_lower_bound"] > 1.0


def test_distributed_steps_are_audited_as_the_server_sees_them(mnist):
    """Distributed mode: K nodes' real contributions (lattice, rounding, discrete Gaussian
    shares) decoded as the server does; the claim is the lattice's Δ₂ over the shares' noise.
    The nodes adding half their share's noise (the negative control) is flagged."""
    correct = _audit(mnist, EngineBug(), clients=2, batch=4)
    assert not correct["flagged"] and correct["mu_claimed"] == pytest.approx(1 / SIGMA, rel=2e-3)
    assert correct["noise_multiplier_estimate"] == pytest.approx(SIGMA, rel=0.1)
    assert correct["clipped_norm_estimate"] == pytest.approx(1.0, abs=0.5)
    broken = _audit(mnist, EngineBug(noise_scale=0.5), clients=2, batch=4)
    assert broken["flagged"] and broken["noise_multiplier_upper_bound"] < SIGMA


def _command(shared_data_dir, tmp_path, capsys, *flags):
    """The command in this process (its imports are already paid for): exit status, JSON, output."""
    from simulations.audit import main

    out = tmp_path / "audit.json"
    try:
        main(["dpsgd", "--target-epsilon", "2", "--parts", "white-box", "--train-size", "100", "--data-dir",
              str(shared_data_dir), "--out", str(out), *flags])
        status = 0
    except SystemExit as done:
        status = done.code
    printed = capsys.readouterr()
    return status, (json.loads(out.read_text()) if status == 0 else None), printed


def test_the_command_flags_an_injected_bug_and_says_so(shared_data_dir, tmp_path, capsys):
    status, result, printed = _command(shared_data_dir, tmp_path, capsys, "--bug-clip-scale", "2")
    assert status == 0, printed.err
    assert result["flagged"] and result["mode"] == "centralized" and "clients" not in result
    assert result["injected_bug"] == {"noise_scale": 1.0, "clip_scale": 2.0}
    lines = printed.out.splitlines()
    assert lines[-2].startswith("verdict: FLAGGED: white-box rejects the claimed ε")
    assert "white-box step audit: step 1/" in printed.err  # progress on long work


def test_the_bugs_are_refused_outside_the_engine(shared_data_dir, tmp_path, capsys):
    status, _, printed = _command(shared_data_dir, tmp_path, capsys, "--privacy", "user", "--bug-noise-scale", "0.5")
    assert status == 2
    assert printed.err.strip().splitlines()[-1].endswith("local mode only, not user")


def test_a_plot_without_the_one_run_part_is_refused_before_any_work(tmp_path, capsys):
    from simulations.audit import main

    with pytest.raises(SystemExit) as done:
        main(["dpsgd", "--target-epsilon", "2", "--parts", "white-box", "--plot", str(tmp_path / "p.png"),
              "--out", str(tmp_path / "a.json")])
    assert done.value.code == 2 and not (tmp_path / "a.json").exists()
    assert capsys.readouterr().err.strip().endswith("run it (--parts one-run or all)")
