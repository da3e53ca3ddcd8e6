"""The one-run DP-SGD audit: its canaries are exactly what it says (Dirac gradients of norm C
that touch nothing else), a small audit of each mode stays below its claim, the no-noise
control is flagged, and a privacy mode that does not exist is refused by the parser."""

import subprocess
import sys

import pytest
import torch

from fedpriv.audit.canaries import CanaryModel, with_canaries
from fedpriv.audit.canary_audit import CanaryAudit
from fedpriv.audit.dpsgd import audit_dpsgd
from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.models import build_model
from fedpriv.seeding import generator
from tests.timeouts import scaled


@pytest.mark.parametrize("mode", ["vmap", "bookkeeping"])
def test_canaries_are_dirac_gradients_that_leave_the_model_alone(mode):
    # one full-batch step without noise: each included canary's weight gets exactly −C/(qN),
    # an excluded one and the sentinels 0, and the real parameters the same step as without any canary
    torch.manual_seed(0)
    features, labels = torch.rand(6, 1, 28, 28), torch.randint(0, 10, (6,))
    included = torch.tensor([True, False, True, True, False])
    config = DPSGDConfig(noise_multiplier=0.0, max_grad_norm=0.5, sample_rate=1.0, grad_sample_mode=mode)
    model = CanaryModel(build_model("cnn", 0), (1, 28, 28), 5, 10, 0.5)
    x, y, _ = with_canaries(features, labels, included)
    train_dpsgd(model, x, y, config=config, steps=1, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                sampling_generator=generator(0, "s"), expected_lot_size=10.0)
    weights = model.canary_weights()
    assert torch.allclose(weights[:5], included.float() * 0.5 / 10.0, rtol=1e-6, atol=0)
    assert not weights[5:].any()  # the sentinels: nothing but noise ever reaches them
    plain = build_model("cnn", 0)
    train_dpsgd(plain, features, labels, config=config, steps=1, optimizer=torch.optim.SGD(plain.parameters(), lr=1.0),
                sampling_generator=generator(0, "s"), expected_lot_size=10.0)
    for (name, p), q in zip(model.base.named_parameters(), plain.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


def _small(data_dir, **kw):
    """The one-run part alone (the white-box step audit has its own tests: test_step_audit.py)."""
    return CanaryAudit(**{"canaries": 1000, "train_size": 100, "epochs": 2, "data_dir": str(data_dir),
                          "target_epsilon": 2.0, "parts": frozenset({"one-run"}), **kw})


@pytest.mark.parametrize("clients", [None, 3])
def test_a_small_audit_stays_below_its_claim(shared_data_dir, clients):
    result = audit_dpsgd(_small(shared_data_dir, clients=clients))
    assert result["claimed_epsilon"] <= 2.0
    assert result["one_run"]["epsilon_lower_bound"] <= result["claimed_epsilon"]
    assert not result["one_run"]["flagged"] and not result["flagged"]
    assert set(result["one_run"]) >= {"epsilon_lower_bound", "confidence", "canaries", "guesses", "correct",
                                      "method", "assumptions"}
    assert set(result) >= {"claimed_epsilon", "mode", "seconds", "white_box"}
    # a centralized audit says so (not "local" with no clients); a federated one names its clients
    assert (result["mode"], result.get("clients")) == (("centralized", None) if clients is None else ("local", 3))


@pytest.mark.parametrize("clients", [None, 3])
def test_training_without_noise_is_flagged(shared_data_dir, clients):
    result = audit_dpsgd(_small(shared_data_dir, clients=clients, unsafe_noise_multiplier=0.0))
    assert result["one_run"]["epsilon_lower_bound"] > result["claimed_epsilon"]
    assert result["one_run"]["flagged"] and result["flagged"]
    assert result["unsafe_noise_multiplier"] == 0.0


@pytest.mark.parametrize("clients", [None, 3])
def test_a_small_distributed_audit_stays_below_its_claim_and_its_no_noise_control_is_flagged(shared_data_dir,
                                                                                              clients):
    """Distributed mode: each step the server sees the decoded sum of the clients' lattice
    vectors and integer noise shares (``distributed_contribution``, what a node sends); the
    claim is the distributed event's ε, which the lower bound must not exceed, and σ = 0
    must be caught."""
    safe = audit_dpsgd(_small(shared_data_dir, clients=clients), "distributed")
    assert safe["claimed_epsilon"] <= 2.0 and safe["one_run"]["epsilon_lower_bound"] <= safe["claimed_epsilon"]
    assert (safe["mode"], safe["clients"]) == ("distributed", clients or 1)
    broken = audit_dpsgd(_small(shared_data_dir, clients=clients, unsafe_noise_multiplier=0.0), "distributed")
    assert broken["one_run"]["epsilon_lower_bound"] > broken["claimed_epsilon"] and broken["flagged"]


def test_an_unknown_privacy_mode_is_refused_in_one_line():
    done = subprocess.run([sys.executable, "-m", "simulations.audit", "dpsgd", "--privacy", "central",
                           "--target-epsilon", "2", "--out", "unused.json"],
                          capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "invalid choice: 'central'" in done.stderr


def test_input_space_canaries_stay_below_the_claim(shared_data_dir):
    result = audit_dpsgd(_small(shared_data_dir, canary_type="input", canaries=100))
    assert "input-space" in result["one_run"]["method"]
    assert result["one_run"]["epsilon_lower_bound"] <= result["claimed_epsilon"]
