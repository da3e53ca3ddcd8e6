"""Model zoo: shapes, parameter counts, no BatchNorm, seeded initialisation, memory layout."""

import copy

import pytest
import torch
from flwr.app import ArrayRecord
from torch import nn

from fedpriv.models import CHANNELS_LAST, MODELS, build_model, input_shape, model_inputs, model_sha256

IMAGES = {"mlp": (1, 28, 28), "cnn": (1, 28, 28), "cifar_cnn": (3, 32, 32), "scatter_linear": (1, 28, 28),
          "scatter_cnn": (1, 28, 28)}


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("name", MODELS)
def test_output_shape_and_no_batchnorm(name: str) -> None:
    model = build_model(name, seed=0)
    inputs = model_inputs(name, torch.rand(4, *IMAGES[name]))
    assert model(inputs).shape == (4, 10)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


@pytest.mark.parametrize("name", MODELS)
def test_input_shape_is_what_model_inputs_gives(name: str) -> None:
    assert model_inputs(name, torch.rand(2, *IMAGES[name])).shape[1:] == input_shape(name, IMAGES[name])


def test_parameter_counts() -> None:
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    assert count(build_model("mlp", 0)) == 795_010  # 784·1000 + 1000 + 1000·10 + 10
    assert count(build_model("cnn", 0)) == 26_010
    assert count(build_model("scatter_linear", 0)) == 81 * 7 * 7 * 10 + 10
    convolutions = (81 * 9 * 16 + 16) + (16 * 9 * 32 + 32) + (32 * 4 * 4 * 32 + 32)
    assert count(build_model("scatter_cnn", 0)) == convolutions + 330
    assert count(build_model("mlp", 0, in_features=60)) == 60 * 1000 + 1000 + 10_010


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_same_params_different_seed_different(name: str) -> None:
    assert torch.equal(_flat(build_model(name, 3)), _flat(build_model(name, 3)))
    assert not torch.equal(_flat(build_model(name, 3)), _flat(build_model(name, 4)))


def test_does_not_touch_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model("cnn", 7)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_model() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet", 0)
    with pytest.raises(ValueError, match="unknown model"):
        model_inputs("resnet", torch.zeros(1, 1, 28, 28))


def test_only_the_scatter_models_transform_their_inputs() -> None:
    images = torch.rand(2, 1, 28, 28)
    assert model_inputs("cnn", images) is images
    assert model_inputs("scatter_linear", images).shape == (2, 81, 7, 7)
    assert torch.equal(model_inputs("scatter_cnn", images), model_inputs("scatter_linear", images))


@pytest.mark.parametrize("name", MODELS)
def test_channels_last_models_come_channels_last_the_others_nchw(name: str) -> None:
    weights = [p for p in build_model(name, 0).parameters() if p.dim() == 4]
    layout = torch.channels_last if name in CHANNELS_LAST else torch.contiguous_format
    assert all(w.is_contiguous(memory_format=layout) for w in weights)
    if name in CHANNELS_LAST:
        assert not all(w.is_contiguous() for w in weights)  # not merely ambiguous


def test_the_cnn_pools_in_channels_last_on_its_inputs() -> None:
    """What the layout is for: the max-pools get channels_last activations."""
    model, pooled = build_model("cnn", 0), []
    for pool in (m for m in model.modules() if isinstance(m, nn.MaxPool2d)):
        pool.register_forward_hook(lambda _module, args, _out: pooled.append(args[0]))
    model(model_inputs("cnn", torch.rand(4, 1, 28, 28)))
    assert len(pooled) == 2
    assert all(a.is_contiguous(memory_format=torch.channels_last) and not a.is_contiguous() for a in pooled)


def test_the_layout_changes_no_weight_sent_or_hashed() -> None:
    """A channels_last model's hash and wire arrays are its NCHW copy's, byte for byte, and
    arrays from an NCHW model load into a built one, which stays channels_last."""
    model = build_model("cnn", 3)
    nchw = copy.deepcopy(model).to(memory_format=torch.contiguous_format)
    assert model_sha256(model) == model_sha256(nchw)
    sent, sent_nchw = ArrayRecord(model.state_dict()), ArrayRecord(nchw.state_dict())
    assert {k: a.data for k, a in sent.items()} == {k: a.data for k, a in sent_nchw.items()}
    received = build_model("cnn", 0)
    received.load_state_dict(sent_nchw.to_torch_state_dict())
    assert model_sha256(received) == model_sha256(model)
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in received.parameters() if p.dim() == 4)
