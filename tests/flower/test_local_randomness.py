"""Who can reproduce a client's DP noise: the node's operator or a simulation, never the server."""

import torch

from clients.config import LocalRandomness, RunSettings
from clients.task import local_seed
from fedpriv.models import build_model
from fedpriv.training import TrainingPlan, model_sha256, train_round

PLAN = TrainingPlan(model="cnn", lot_size=8, max_grad_norm=1.0, noise_multiplier=1.0, lr=0.1)


def _train(seed: int, secure_noise: bool) -> str:
    x = torch.zeros(32, 1, 28, 28)
    y = torch.zeros(32, dtype=torch.long)
    model = build_model("cnn", seed=0)
    train_round(model, x, y, PLAN, seed=seed, client=0, round_=1, device="cpu", secure_noise=secure_noise)
    return model_sha256(model)


def test_deployment_default_is_secret_from_the_run_seed():
    settings = RunSettings()
    assert settings.local_randomness is LocalRandomness.SECURE
    (seed_a, secure_a), (seed_b, secure_b) = (local_seed(settings, {}) for _ in range(2))
    assert secure_a and secure_b
    assert seed_a != seed_b != settings.seed


def test_simulations_use_the_run_seed_and_a_node_seed_wins():
    settings = RunSettings(seed=7, local_randomness=LocalRandomness.RUN_SEED)
    assert local_seed(settings, {}) == (7, False)
    assert local_seed(RunSettings(seed=7), {"local-seed": 99}) == (99, False)
    assert RunSettings.from_run_config({"local-randomness": "run-seed"}).local_randomness is LocalRandomness.RUN_SEED


def test_secure_noise_cannot_be_regenerated_from_the_seed():
    assert _train(seed=3, secure_noise=False) == _train(seed=3, secure_noise=False)
    assert _train(seed=3, secure_noise=True) != _train(seed=3, secure_noise=True)
