"""DP dropout (fedpriv.algorithms.dpdropout) and ``python -m simulations.dpdropout``: the
per-layer sensitivity (Hypothesis: replacing one example moves each clipped layer sum by
at most 2C, removing one by at most C, reached), the noise on the update (KS test against
N(0, 4C²σ²), failing at 1.2×), the booked ε against dp-accounting directly, and the
command's output and bad inputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import dp_accounting
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedpriv.algorithms import dpdropout
from fedpriv.algorithms.dpdropout import GaussianDropout, Settings, network, train
from fedpriv.dpsgd.engine import clipped_sum_function, gradient_buffers
from fedpriv.dpsgd.modules import trainable_parameters
from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[2]
FEATURES = 6


def small(method: str = "dpd", **overrides: float | int) -> Settings:
    chosen = dict(method=method, hidden=12, max_grad_norm=1.0, lot_size=4, epochs=1, lr=1.0,
                  dropout=0.3 if method == "dpd" else 0.0)
    return Settings(**{**chosen, **overrides})


def clipped_sums(settings_: Settings, x: torch.Tensor, y: torch.Tensor, seed: int = 0) -> list[torch.Tensor]:
    """Σ_i clip(g_i) per parameter tensor, as the engine computes it for a lot of all of (x, y);
    the dropout stream reset to ``seed`` so that the unchanged examples draw the same masks."""
    model = network(FEATURES, settings_, 0)
    for module in model.modules():
        if isinstance(module, GaussianDropout):
            module.generator = torch.Generator().manual_seed(seed)
    model.train()
    params = trainable_parameters(model)
    config = settings_.engine_config(1.0, len(y))
    flat, grads = gradient_buffers(params)
    flat.zero_()
    with clipped_sum_function(model, params, F.cross_entropy, config) as clipped_sum:
        clipped_sum(x, y, grads)
    return [g.clone() for g in grads]


values = st.floats(-1e4, 1e4, allow_nan=False, width=32)
rows = st.lists(values, min_size=FEATURES, max_size=FEATURES)


@settings(max_examples=60, deadline=None)
@given(data=st.lists(rows, min_size=2, max_size=5), other=rows, labels=st.lists(st.integers(0, 9), min_size=6,
       max_size=6), new_label=st.integers(0, 9), clip=st.floats(0.01, 10.0), method=st.sampled_from(["dpd", "sgld"]))
def test_replacing_one_example_moves_each_clipped_layer_sum_by_at_most_2c(data, other, labels, new_label, clip,
                                                                          method):
    settings_ = small(method, max_grad_norm=clip)
    x = torch.tensor(data)
    y = torch.tensor(labels[:len(data)])
    x2, y2 = x.clone(), y.clone()
    x2[0], y2[0] = torch.tensor(other), new_label
    for before, after in zip(clipped_sums(settings_, x, y), clipped_sums(settings_, x2, y2)):
        assert float(torch.linalg.vector_norm(before - after)) <= 2 * clip * (1 + 1e-5) + 1e-6
    if method == "sgld":  # (with dropout, removing a row would shift the later rows' masks)
        removed = clipped_sums(settings_, x[1:], y[1:])
        whole = clipped_sums(settings_, x, y)
        change = [float(torch.linalg.vector_norm(a - b)) ** 2 for a, b in zip(whole, removed)]
        # add/remove: at most C per layer, C·√K = 2C in all: the sensitivity the booked σ is for
        assert max(change) <= (clip * (1 + 1e-5) + 1e-6) ** 2
        assert math.sqrt(sum(change)) <= 2 * clip * (1 + 1e-5) + 1e-6


def test_the_per_layer_bound_is_reached():
    clip = 0.01  # below every tensor's gradient norm for this far-off example
    settings_ = small("sgld", max_grad_norm=clip)
    x, y = torch.full((1, FEATURES), 50.0), torch.tensor([3])
    for tensor_sum in clipped_sums(settings_, x, y):
        assert float(torch.linalg.vector_norm(tensor_sum)) == pytest.approx(clip, rel=1e-4)


@pytest.mark.parametrize("method", ["dpd", "sgld", "dpsgd"])
def test_the_update_carries_noise_of_std_2c_sigma(method):
    # same seed with σ and with σ = 0: same lots, same dropout masks, same clipped sums, so
    # the parameters differ by exactly the step times the noise (q = 1: one step, lot = all)
    settings_ = small(method, hidden=400, lot_size=8, max_grad_norm=0.7)
    sigma, seed = 1.3, 4
    x, y = torch.randn(8, FEATURES, generator=torch.Generator().manual_seed(1)), torch.arange(8)
    models = []
    for noise_multiplier in (sigma, 0.0):
        model = network(FEATURES, settings_, seed)
        train(model, x, y, settings_, noise_multiplier, seed=seed)
        models.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    step = settings_.learning_rate(1) / len(y)  # the noisy sum is divided by q·N = 8
    noise = (models[1] - models[0]).double().numpy() / step
    std = 2 * settings_.max_grad_norm * sigma
    assert stats.kstest(noise, stats.norm(scale=std).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.norm(scale=1.2 * std).cdf).pvalue < 1e-6
    assert stats.kstest(noise, stats.norm(scale=std / 1.2).cdf).pvalue < 1e-6


def test_the_booked_events_reach_epsilon_under_dp_accounting():
    settings_ = small("dpd", lot_size=10, epochs=3)
    x, y = torch.randn(40, FEATURES), torch.randint(0, 10, (40,))
    sigma = dpdropout.calibrate(settings_, 1.0, 1e-4, len(y))
    events = train(network(FEATURES, settings_, 0), x, y, settings_, sigma, seed=0)
    assert len(events) == settings_.epochs  # one per epoch (the step size changes per epoch)
    q, steps = settings_.sample_rate(len(y)), settings_.steps(len(y))
    reference = dp_accounting.rdp.RdpAccountant()
    reference.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    assert 0.95 <= reference.get_epsilon(1e-4) <= 1.0
    from fedpriv.privacy import Budget, PrivacyLedger

    ledger = PrivacyLedger(Budget(1.0, 1e-4))
    ledger.record("0", "train", events)
    assert ledger.spent("0") == pytest.approx(reference.get_epsilon(1e-4), rel=1e-3)


def test_dropout_is_gaussian_per_example_and_off_in_eval():
    layer = GaussianDropout(0.5, torch.Generator().manual_seed(0))  # α = 1
    out = layer(torch.ones(4000, 50))
    assert stats.kstest(out.flatten().numpy(), stats.norm(loc=1, scale=1).cdf).pvalue > 1e-3
    layer.eval()
    assert torch.equal(layer(torch.ones(3, 2)), torch.ones(3, 2))


def test_settings_are_checked():
    for bad in (dict(method="adam"), dict(dropout=1.0), dict(hidden=0), dict(lr=math.inf)):
        with pytest.raises(ValueError):
            small(**bad)
    with pytest.raises(ValueError, match="only dpd"):
        small("sgld", dropout=0.1)


def command(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulations.dpdropout", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=scaled(600), env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("argv, flag", [
    (("--dataset", "digits"), "--epsilon"),
    (("--dataset", "digits", "--epsilon", "-1"), "--epsilon"),
    (("--dataset", "digits", "--epsilon", "nan"), "--epsilon"),
    (("--dataset", "cifar10", "--epsilon", "1"), "--dataset"),
    (("--dataset", "digits", "--table", "--epsilon", "1"), "--epsilon"),
    (("--dataset", "digits", "--table", "--seeds", "2"), "--seeds"),
    (("--dataset", "digits", "--epsilon", "1", "--method", "sgld", "--dropout", "0.1"), "--dropout"),
    (("--dataset", "digits", "--epsilon", "1", "--dropout", "1"), "--dropout"),
    (("--dataset", "digits", "--epsilon", "1", "--accountant", "paper"), "--accountant"),
    (("--dataset", "digits", "--epsilon", "1", "--clients", "1"), "--clients"),
])
def test_bad_input_is_one_line_and_exit_2(argv, flag):
    done = command(*argv)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m simulations.dpdropout: error:") and flag in lines[0]


def test_missing_mnist_is_one_line_before_training(tmp_path, capsys):
    from simulations import dpdropout as cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["--dataset", "mnist", "--epsilon", "1", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "MNIST" in err[0]


def test_the_command_prints_the_documented_json(tmp_path):
    from simulations import dpdropout as cli

    out = tmp_path / "run.json"
    result = cli.main(["--dataset", "digits", "--method", "dpd", "--epsilon", "2", "--epochs", "2",
                       "--lot-size", "2000", "--out", str(out)])
    assert list(result)[:10] == ["dataset", "method", "epsilon", "delta", "accountant", "noise_multiplier",
                                 "accuracy", "epochs", "seconds", "client_epsilon"]
    assert json.loads(out.read_text()) == result
    assert result["delta"] == 1e-4 and result["accountant"] == "rdp" and result["epochs"] == 2
    assert result["randomness"] == "seeded"
    assert 1.9 <= result["client_epsilon"]["0"] <= 2.0
    assert result["accuracy"] > 0.3  # 10 classes


def test_the_paper_recipe_is_labelled_with_its_sound_epsilon(capsys):
    from fedpriv.privacy import dpdropout as paper
    from simulations import dpdropout as cli

    result = cli.main(["--dataset", "digits", "--method", "sgld", "--epsilon", "0.5", "--epochs", "2",
                       "--paper-recipe", "zcdp"])
    settings_ = dpdropout.settings("digits", "sgld", epochs=2)
    n = 1437
    q, steps = settings_.sample_rate(n), settings_.steps(n)
    assert result["noise_multiplier"] == pytest.approx(paper.paper_zcdp_sigma(0.5, q, steps, 1e-4, 1e-4))
    reference = dp_accounting.rdp.RdpAccountant()
    reference.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(
        result["noise_multiplier"])), steps)
    assert result["sound_epsilon"] == pytest.approx(reference.get_epsilon(1e-4), rel=1e-3)
    assert result["client_epsilon"]["0"] == pytest.approx(result["sound_epsilon"])
    assert "not a guarantee" in result["paper_recipe"] and "not a guarantee" in capsys.readouterr().err


def test_the_table_has_every_method_beside_the_paper(tmp_path):
    from simulations import dpdropout as cli

    out = tmp_path / "table.json"
    cli.main(["--dataset", "digits", "--table", "--epochs", "1", "--lot-size", "2000", "--method", "sgld",
              "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert sorted({(r["epsilon"], r["seed"]) for r in runs}) == [(e, s) for e in (0.5, 1.0, 10.0) for s in range(3)]
    text = out.with_suffix(".md").read_text()
    assert "| **sgld** (fedpriv) |" in text and "| DPD-zCDP (paper) | 0.9518 | 0.9367 | 0.9125 |" in text
    row = next(line for line in text.splitlines() if line.startswith("| **sgld**"))
    assert row.count(" ± ") == 3


@pytest.mark.usefixtures("task_identity")
def test_federated_dpd_books_every_round_in_each_node_and_stops_at_the_budget(tmp_path):
    from dataclasses import replace

    from clients.classic.client_app import app
    from fedpriv.algorithms.datasets import load
    from fedpriv.privacy import PrivacyLedger
    from fedpriv.privacy.events import to_dp_accounting
    from server.classic.loops import federated_dpdropout
    from tests.flower.inprocess import InProcessGrid, node_config

    nodes = {i: node_config(i, 3, tmp_path, **{"epsilon-budget": 4.0, "delta": 1e-4, "randomness": "seeded",
                                                "seed": 1}) for i in range(3)}
    grid = InProcessGrid({}, nodes, client_app=app)
    settings_ = Settings("dpd", hidden=32, max_grad_norm=0.5, lot_size=1, epochs=3, lr=16.0, dropout=0.05,
                         fixed_sample_rate=0.5)
    sigma = dpdropout.calibrate(settings_, 4.0, 1e-4, 1)
    model, shares = federated_dpdropout(grid, "digits", 0, settings_, sigma, share_size=479)
    assert not shares.refused and all(len(events) == 3 for events in shares.events.values())
    for client in range(3):
        booked = PrivacyLedger.load(tmp_path / f"node{client}" / "ledger.json").entries(str(client))
        assert len(booked) == 3
        reference = dp_accounting.rdp.RdpAccountant()  # dp-accounting's own orders
        for events in booked.values():
            for event in events:
                reference.compose(to_dp_accounting(event))
        assert 3.8 < reference.get_epsilon(1e-4) <= 4.0 * 1.01
    _, _, x_test, y_test = load("digits", 0)
    assert dpdropout.accuracy(model, dpdropout.digits_features(x_test), torch.as_tensor(y_test).long()) > 0.5
    _, again = federated_dpdropout(grid, "digits", 0, replace(settings_, epochs=1), sigma, share_size=479)
    assert len(again.refused) == 3 and all("exceed its budget" in r for r in again.refused.values())


@pytest.mark.usefixtures("task_identity")
def test_a_node_refuses_a_malformed_dpd_request_before_booking(tmp_path):
    from clients.classic.client_app import app
    from server.classic.loops import federated_dpdropout
    from tests.flower.inprocess import InProcessGrid, booked, node_config

    grid = InProcessGrid({}, {0: node_config(0, 1, tmp_path, **{"epsilon-budget": 4.0, "randomness": "seeded",
                                                                "seed": 1})}, client_app=app)
    settings_ = Settings("dpd", hidden=8, max_grad_norm=0.5, lot_size=1, epochs=1, lr=1.0, fixed_sample_rate=0.5)
    _, shares = federated_dpdropout(grid, "iris", 0, settings_, 2.0, share_size=100)
    assert len(shares.refused) == 1 and "digits" in next(iter(shares.refused.values()))
    assert not booked(tmp_path / "node0")


def test_unseeded_training_draws_lots_and_noise_from_the_os():
    settings_ = small("dpd", lot_size=4)
    x, y = torch.randn(8, FEATURES), torch.randint(0, 10, (8,))
    models = [network(FEATURES, settings_, 0) for _ in range(2)]
    events = [train(model, x, y, settings_, 1.0, seed=None) for model in models]
    assert events[0] == events[1] and len(events[0]) == 1
    assert not torch.equal(models[0][1].weight, models[1][1].weight)  # two draws, not one seed
