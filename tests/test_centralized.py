"""fedpriv.training and ``python -m simulations.centralized``: utility on a short MNIST run,
reproducibility, calibration, the JSON result and the command's errors."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedpriv.data import load_dataset
from fedpriv.models import build_model, model_sha256
from fedpriv.privacy import ComposedEvent, epsilon_of
from fedpriv.training import (
    TrainingPlan,
    calibrate_plan,
    default_plan,
    evaluate,
    train_round,
)
from simulations import centralized
from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"dataset", "model", "accuracy", "epsilon", "delta", "noise_multiplier", "max_grad_norm",
        "sample_rate", "steps", "seconds", "model_sha256"}
SMALL = TrainingPlan(model="cnn", lot_size=256, max_grad_norm=0.1, noise_multiplier=1.0, lr=2.0)


@pytest.fixture(scope="module")
def mnist(shared_data_dir: Path):
    return (load_dataset("mnist", shared_data_dir, limit=8000),
            load_dataset("mnist", shared_data_dir, train=False, limit=2000))


def test_short_dpsgd_run_learns(mnist) -> None:
    train, test = mnist
    model = build_model("cnn", seed=0)
    events = []
    for round_ in (1, 2, 3, 4, 5, 6, 7, 8):  # 8 × 31 = 248 steps at q = 0.032
        report = train_round(model, *train, SMALL, seed=0, client=0, round_=round_, device="cpu")
        assert report.events == SMALL.round_events(len(train.labels))  # what a server books
        events += report.events
    _, accuracy = evaluate(model, *test)
    assert accuracy >= 0.85
    assert math.isfinite(epsilon_of(ComposedEvent(tuple(events)), 1e-5))


def test_train_round_is_reproducible_and_keyed_by_client_and_round(mnist) -> None:
    train, _ = mnist
    subset = (train.features[:600], train.labels[:600])

    def digest(client: int, round_: int) -> str:
        model = build_model("cnn", seed=1)
        train_round(model, *subset, SMALL, seed=1, client=client, round_=round_, device="cpu")
        return model_sha256(model)

    assert digest(0, 1) == digest(0, 1)
    assert len({digest(0, 1), digest(1, 1), digest(0, 2)}) == 3


def test_calibrate_plan_meets_target() -> None:
    plan = calibrate_plan(SMALL, target_epsilon=1.0, delta=1e-5, num_examples=60_000, rounds=10)
    steps = 10 * plan.steps_per_round(60_000)
    assert steps == 10 * round(60_000 / 256)
    from fedpriv.privacy import dpsgd_event

    eps = epsilon_of(dpsgd_event(plan.noise_multiplier, plan.sample_rate(60_000), steps), 1e-5)
    assert 0.9 < eps <= 1.0


def test_plan_validation_and_non_private() -> None:
    with pytest.raises(ValueError, match="lot_size"):
        dataclasses.replace(SMALL, lot_size=0)
    with pytest.raises(ValueError, match="shared_sample_rate"):
        dataclasses.replace(SMALL, shared_sample_rate=1.5)
    with pytest.raises(ValueError, match="model"):
        dataclasses.replace(SMALL, model="vgg")
    with pytest.raises(ValueError, match="max_grad_norm"):
        dataclasses.replace(SMALL, max_grad_norm=-1.0)
    with pytest.raises(ValueError, match="lr_decay_rounds"):
        dataclasses.replace(SMALL, lr_decay_rounds=-1)
    plain = SMALL.non_private()
    assert not plain.private and plain.max_grad_norm == math.inf
    assert default_plan("mnist").model == "scatter_linear"


def test_lr_schedule_is_a_function_of_the_round() -> None:
    assert SMALL.lr_at(1) == SMALL.lr_at(50) == SMALL.lr
    assert dataclasses.replace(SMALL, lr_decay_rounds=4).lr_at(3) == SMALL.lr  # constant schedule
    cosine = dataclasses.replace(SMALL, lr_schedule="cosine", lr_decay_rounds=4)
    lrs = [cosine.lr_at(r) for r in (1, 2, 3, 4, 5)]
    assert lrs[0] == SMALL.lr and lrs[2] == pytest.approx(SMALL.lr / 2)
    assert all(a > b for a, b in zip(lrs, lrs[1:4])) and lrs[4] == 0.0


def test_evaluate_and_sha256() -> None:
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
        model.bias.zero_()
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    _, accuracy = evaluate(model, x, torch.tensor([0, 1, 1]), batch_size=2)
    assert accuracy == pytest.approx(2 / 3)
    before = model_sha256(model)
    assert len(before) == 64 and before == model_sha256(model)
    with torch.no_grad():
        model.bias[0] += 1e-6
    assert model_sha256(model) != before


def _cli(shared: Path, *flags: str) -> list[str]:
    return ["--dataset", "mnist", "--data-dir", str(shared), "--limit-train", "500", "--epochs", "1", *flags]


def test_command_end_to_end(shared_data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "simulations.centralized", *_cli(shared_data_dir, "--target-epsilon", "2",
                                                                 "--lot-size", "100", "--out", str(out))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(900),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout) == result
    assert KEYS <= result.keys()
    assert 0 < result["epsilon"] <= 2 and result["delta"] == 1e-5
    assert result["sample_rate"] == 0.2 and result["steps"] == 5
    assert result["max_physical_batch"] == 500  # chosen to fit: here every lot in one micro-batch


def test_command_same_seed_same_model_and_non_private(shared_data_dir: Path, capsys) -> None:
    first = centralized.main(_cli(shared_data_dir, "--seed", "3", "--lot-size", "100"))
    second = centralized.main(_cli(shared_data_dir, "--seed", "3", "--lot-size", "100"))
    assert first["model_sha256"] == second["model_sha256"] and first["epsilon"] <= 1.0
    plain = centralized.main(_cli(shared_data_dir, "--non-private", "--lot-size", "100"))
    assert plain["private"] is False and plain["epsilon"] is None and plain["noise_multiplier"] == 0
    json.loads(json.dumps(plain, allow_nan=False))


@pytest.mark.parametrize("flags, message", [
    (["--target-epsilon", "-1"], "must be > 0"),
    (["--target-epsilon", "1", "--noise-multiplier", "1"], "not allowed with"),
    (["--dataset", "svhn"], "invalid choice"),
    (["--max-physical-batch", "0"], "argument --max-physical-batch: must be >= 1"),
    (["--data-dir", "/nonexistent/fedpriv"], "--download"),
])
def test_command_errors(flags: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        centralized.main(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
