"""The one-run audit of central user-level DP-FedAvg (``privacy = "user"``): canary clients
among real ones, scored from each round's released model. A small audit stays below the
user-level event's ε (checked against dp-accounting), its no-noise control is flagged, and
the command runs it."""

import json
import subprocess
import sys

import dp_accounting
import pytest

from fedpriv.audit.canary_audit import CanaryAudit, NotAvailableError
from fedpriv.audit.dpsgd import audit_dpsgd
from tests.timeouts import scaled


def _small(data_dir, **kw):
    # 3 real clients on 100 MNIST records, 1,000 canary clients, q = 0.1, 20 rounds
    return CanaryAudit(**{"canaries": 1000, "train_size": 100, "epochs": 2, "clients": 3,
                          "data_dir": str(data_dir), "target_epsilon": 2.0, **kw})


def _user_level_epsilon(noise_multiplier, sample_rate, rounds, delta):
    """ε of ``rounds`` Poisson-sampled Gaussian rounds (McMahan et al. 2018), by dp-accounting."""
    event = dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier))
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(event, rounds)
    return accountant.get_epsilon(delta)


def test_a_small_user_level_audit_stays_below_its_claim(shared_data_dir):
    result = audit_dpsgd(_small(shared_data_dir), "user")
    reference = _user_level_epsilon(result["noise_multiplier"], 0.1, 20, 1e-5)
    assert result["claimed_epsilon"] == pytest.approx(reference, rel=1e-3)
    assert 1.9 < result["claimed_epsilon"] <= 2.0  # z calibrated for the target, as the server does
    assert result["one_run"]["epsilon_lower_bound"] <= result["claimed_epsilon"] and not result["flagged"]
    assert result["one_run"]["estimated_noise_multiplier"] == pytest.approx(result["noise_multiplier"], rel=0.15)
    assert (result["mode"], result["clients"], result["steps"]) == ("user", 3, 20)
    assert "skipped" in result["white_box"]  # the engine's step audit: local mode only


def test_a_user_level_audit_without_noise_is_flagged(shared_data_dir):
    result = audit_dpsgd(_small(shared_data_dir, unsafe_noise_multiplier=0.0), "user")
    assert result["unsafe_noise_multiplier"] == 0.0
    assert result["one_run"]["epsilon_lower_bound"] > result["claimed_epsilon"] and result["flagged"]


def test_user_level_input_canaries_are_refused():
    with pytest.raises(NotAvailableError, match="canary clients only"):
        audit_dpsgd(CanaryAudit(canaries=10, canary_type="input"), "user")


def test_the_command_audits_user_level(shared_data_dir, tmp_path):
    out = tmp_path / "user.json"
    done = subprocess.run([sys.executable, "-m", "simulations.audit", "dpsgd", "--privacy", "user", "--canaries", "20",
                           "--train-size", "20", "--epochs", "1", "--clients", "2", "--target-epsilon", "2",
                           "--data-dir", str(shared_data_dir), "--out", str(out)],
                          capture_output=True, text=True, timeout=scaled(300))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert (result["mode"], result["clients"], result["one_run"]["canaries"]) == ("user", 2, 20)
    assert result["one_run"]["epsilon_lower_bound"] <= result["claimed_epsilon"]
    assert done.stdout.splitlines()[-2].startswith("verdict: not flagged")
