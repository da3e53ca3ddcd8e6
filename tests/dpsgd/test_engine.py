"""train_dpsgd end to end: schedule, micro-batching, optimizers, events, refused models."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import build, generators
from torch import nn

from fedpriv.dpsgd import DPSGDConfig, UnsupportedModuleError, train_dpsgd
from fedpriv.dpsgd.engine import examples_at
from fedpriv.dpsgd.modules import trainable_parameters
from fedpriv.dpsgd.per_example import per_example_gradients
from fedpriv.dpsgd.sampling import poisson_lot
from fedpriv.privacy.events import dpsgd_event

MODES = ["vmap", "bookkeeping"]


def run(model, data, steps=3, optimizer=None, seeds=(1, 2), **config):
    settings = {"noise_multiplier": 1.0, "max_grad_norm": 0.5, "sample_rate": 0.25} | config
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=1.0)
    return train_dpsgd(
        model, *data, config=DPSGDConfig(**settings), steps=steps, optimizer=optimizer, **generators(*seeds)
    )


def flat_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("mode", MODES)
def test_non_private_schedule_equals_sgd_on_the_same_lot(mode, data):
    model, reference = build("mlp"), build("mlp")
    q, lr = 0.25, 0.1
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    run(model, data, steps=1, optimizer=opt, noise_multiplier=0.0, max_grad_norm=math.inf,
        grad_sample_mode=mode)
    lot = poisson_lot(len(data[0]), q, generators()["sampling_generator"])
    assert 0 < lot.numel() < len(data[0])
    x, y = data[0][lot], data[1][lot]
    # Σ_i loss_i / (q·N): the mean over the lot, normalised by the *expected* lot size.
    (F.cross_entropy(reference(x), y, reduction="sum") / (q * len(data[0]))).backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= lr * p.grad
    torch.testing.assert_close(flat_params(model), flat_params(reference))


@pytest.mark.parametrize("mode", MODES)
def test_a_step_is_noise_plus_clipped_sum_over_the_expected_lot_size(mode, data):
    """θ ← θ − (Σ_i clip_C(g_i) + σC·z)/(qN), z the noise generator's first N(0, I) draw."""
    model, reference = build("cnn"), build("cnn")
    sigma, C, q = 0.7, 2.8, 0.5
    run(model, data, steps=1, noise_multiplier=sigma, max_grad_norm=C, sample_rate=q, grad_sample_mode=mode)
    lot = poisson_lot(len(data[0]), q, generators()["sampling_generator"])
    params = trainable_parameters(reference)
    grads, _ = per_example_gradients(reference, params, data[0][lot], data[1][lot], F.cross_entropy)
    per_example = torch.cat([g.flatten(1) for g in grads.values()], 1)  # (B, P)
    norms = per_example.norm(dim=1, keepdim=True)
    assert (norms > C).any() and (norms < C).any()  # both clipped and untouched examples
    clipped_sum = (per_example * (C / norms.clamp(min=C))).sum(0)
    noise = torch.randn(per_example.shape[1], generator=generators()["noise_generator"]) * (sigma * C)
    want = flat_params(reference) - (clipped_sum + noise) / (q * len(data[0]))
    torch.testing.assert_close(flat_params(model), want, rtol=1e-5, atol=1e-6)


def test_full_batch_non_private_step_is_plain_gradient_descent(data):
    model, reference = build("cnn"), build("cnn")
    run(model, data, steps=1, noise_multiplier=0.0, max_grad_norm=math.inf, sample_rate=1.0)
    F.cross_entropy(reference(data[0]), data[1]).backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= p.grad
    torch.testing.assert_close(flat_params(model), flat_params(reference))


@pytest.mark.parametrize("mode", MODES)
def test_micro_batching_gives_the_same_update(mode, data):
    small, big = build("cnn"), build("cnn")
    run(small, data, max_physical_batch_size=3, grad_sample_mode=mode, sample_rate=0.5)
    run(big, data, max_physical_batch_size=512, grad_sample_mode=mode, sample_rate=0.5)
    torch.testing.assert_close(flat_params(small), flat_params(big), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
def test_auto_mode_trains_like_vmap(clipping, data):
    auto, plain = build("mlp"), build("mlp")
    run(auto, data, clipping=clipping)
    run(plain, data, clipping=clipping, grad_sample_mode="vmap")
    torch.testing.assert_close(flat_params(auto), flat_params(plain), rtol=1e-5, atol=1e-6)


def test_auto_mode_falls_back_to_vmap_for_a_layer_run_twice(data):
    from test_gradients import Recurrent

    torch.manual_seed(0)
    auto = Recurrent()
    plain = copy.deepcopy(auto)
    run(auto, data)
    run(plain, data, grad_sample_mode="vmap")
    torch.testing.assert_close(flat_params(auto), flat_params(plain), rtol=1e-5, atol=1e-6)


def test_report_carries_the_event_and_counts(data):
    report = run(build("mlp"), data, steps=4, noise_multiplier=1.3, sample_rate=0.25)
    assert report.events == (dpsgd_event(1.3, 0.25, 4),)
    assert report.steps == 4 and report.num_examples == len(data[0])
    assert math.isfinite(report.mean_loss) and report.mean_loss > 0
    silent = run(build("mlp"), data, steps=0, noise_multiplier=0.0, max_grad_norm=math.inf)
    assert silent.events == (dpsgd_event(0.0, 0.25, 0),) and math.isnan(silent.mean_loss)


def test_an_empty_lot_still_takes_a_noisy_step(data):
    model = build("mlp")
    before = flat_params(model)
    report = run(model, data, steps=1, sample_rate=1e-9)
    assert math.isnan(report.mean_loss)  # nothing was sampled
    assert not torch.equal(before, flat_params(model))


def test_any_optimizer_receives_the_privatised_gradient(data):
    sgd_model, adam_model = build("mlp"), build("mlp")
    before = [p.detach().clone() for p in sgd_model.parameters()]
    run(sgd_model, data, steps=1)  # lr = 1: the change is minus the privatised gradient
    privatised = [b - p.detach() for b, p in zip(before, sgd_model.parameters())]
    run(adam_model, data, steps=1, optimizer=torch.optim.Adam(adam_model.parameters(), lr=0.01))
    reference = build("mlp")
    for p, g in zip(reference.parameters(), privatised):
        p.grad = g
    torch.optim.Adam(reference.parameters(), lr=0.01).step()
    torch.testing.assert_close(flat_params(adam_model), flat_params(reference), rtol=1e-4, atol=1e-6)


def test_lots_gathered_from_channels_last_features_stay_channels_last():
    x = torch.randn(8, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    lot, _ = examples_at(x, torch.zeros(8), torch.tensor([1, 4, 6]))
    assert lot.is_contiguous(memory_format=torch.channels_last) and not lot.is_contiguous()


@pytest.mark.parametrize("mode", MODES)
def test_a_channels_last_model_trains_like_its_nchw_copy_and_stays_channels_last(mode):
    """The contiguous gradient buffer and momentum update channels_last parameters as they do NCHW ones."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 3, 7, 7, generator=gen), torch.randint(0, 3, (32,), generator=gen)
    trained = []
    for layout in (torch.contiguous_format, torch.channels_last):
        model = build("rgb_cnn").to(memory_format=layout)
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        run(model, (x.contiguous(memory_format=layout), y), optimizer=opt, grad_sample_mode=mode)
        assert all(p.is_contiguous(memory_format=layout) for p in model.parameters() if p.dim() == 4)
        trained.append(flat_params(model))
    torch.testing.assert_close(trained[1], trained[0], rtol=1e-5, atol=1e-6)


def secure_run(model, data, sigma=1.0, **generators_passed):
    return train_dpsgd(
        model, *data, config=DPSGDConfig(sigma, 1.0, 0.25, secure_mode=True), steps=1,
        optimizer=torch.optim.SGD(model.parameters(), lr=1.0), **generators_passed,
    )


@pytest.mark.parametrize("sigma", [1.0, 0.0])
def test_secure_mode_needs_no_generator_and_is_not_reproducible(sigma, data):
    """σ = 0: the lots alone differ, so they too come from the CSPRNG, not a fixed stream."""
    first, second = build("mlp"), build("mlp")
    for model in (first, second):
        secure_run(model, data, sigma)
    assert not torch.equal(flat_params(first), flat_params(second))


@pytest.mark.parametrize("passed", ["sampling_generator", "noise_generator"])
def test_secure_mode_refuses_generators_it_would_not_use(passed, data):
    with pytest.raises(ValueError, match="secure_mode"):
        secure_run(build("mlp"), data, **{passed: torch.Generator().manual_seed(0)})


def test_without_secure_mode_a_sampling_generator_is_required(data):
    model = build("mlp")
    with pytest.raises(ValueError, match="sampling_generator"):
        train_dpsgd(model, *data, config=DPSGDConfig(0.0, 1.0, 0.25), steps=1,
                    optimizer=torch.optim.SGD(model.parameters(), lr=1.0))


@pytest.mark.parametrize("mode", MODES)
def test_expected_lot_size_is_the_divisor_of_the_noisy_sum(mode, data):
    """Same lots and noise: the update scales as 1 / expected_lot_size; the default is q·N."""
    q, n = 0.25, len(data[0])
    updates = {}
    for divisor in (None, q * n, 3.0 * q * n):
        model = build("cnn")
        before = flat_params(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        train_dpsgd(model, *data, config=DPSGDConfig(1.0, 0.5, q, grad_sample_mode=mode), steps=1,
                    optimizer=optimizer, expected_lot_size=divisor, **generators())
        updates[divisor] = before - flat_params(model)
    assert torch.equal(updates[None], updates[q * n])
    torch.testing.assert_close(updates[3.0 * q * n], updates[None] / 3, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "16"])
def test_expected_lot_size_must_be_finite_and_positive(bad, data):
    model = build("mlp")
    with pytest.raises(ValueError, match="expected_lot_size"):
        train_dpsgd(model, *data, config=DPSGDConfig(1.0, 0.5, 0.25), steps=1,
                    optimizer=torch.optim.SGD(model.parameters(), lr=1.0), expected_lot_size=bad,
                    **generators())


@pytest.mark.parametrize("mode", MODES)
def test_dropout_trains_with_a_mask_per_example(mode, data):
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3))
    report = run(model, data, grad_sample_mode=mode)
    assert math.isfinite(report.mean_loss)
    same = data[0][:1].expand(8, -1, -1, -1)
    same_labels = data[1][:1].expand(8)
    grads, _ = per_example_gradients(model, trainable_parameters(model), same, same_labels, F.cross_entropy)
    assert not torch.allclose(grads["4.weight"][0], grads["4.weight"][1])


@pytest.mark.parametrize(
    "layer", [nn.BatchNorm2d(1), nn.SyncBatchNorm(1), nn.InstanceNorm2d(1, track_running_stats=True)]
)
def test_batch_mixing_layers_are_refused_with_a_hint(layer, data):
    model = nn.Sequential(layer, build("mlp"))
    with pytest.raises(UnsupportedModuleError, match="GroupNorm"):
        run(model, data)


def test_instance_norm_without_running_stats_is_accepted(data):
    run(nn.Sequential(nn.InstanceNorm2d(1), build("mlp")), data, steps=1)


def test_inputs_are_validated(data):
    x, y = data
    with pytest.raises(ValueError, match="labels"):
        run(build("mlp"), (x, y[:-1]))
    with pytest.raises(ValueError, match="steps"):
        run(build("mlp"), data, steps=-1)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="separate generators"):
        train_dpsgd(build("mlp"), x, y, config=DPSGDConfig(1.0, 1.0, 0.1), steps=1,
                    optimizer=torch.optim.SGD(build("mlp").parameters(), lr=1.0),
                    sampling_generator=gen, noise_generator=gen)


def test_progress_bar_does_not_change_the_result(data, capsys):
    quiet, loud = build("mlp"), build("mlp")
    run(quiet, data)
    train_dpsgd(loud, *data, config=DPSGDConfig(1.0, 0.5, 0.25), steps=3,
                optimizer=torch.optim.SGD(loud.parameters(), lr=1.0), progress=True, **generators())
    assert "DP-SGD" in capsys.readouterr().err
    torch.testing.assert_close(flat_params(quiet), flat_params(loud))


def test_model_is_not_modified_on_refusal(data):
    model = nn.Sequential(nn.BatchNorm2d(1), build("mlp"))
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(UnsupportedModuleError):
        run(model, data)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key])
