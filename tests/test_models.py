"""Model zoo: shapes, parameter counts, no BatchNorm, seeded initialisation."""

import pytest
import torch
from torch import nn

from fedpriv.models import MODELS, build_model, input_shape, model_inputs

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
    assert count(build_model("scatter_cnn", 0)) == (81 * 9 * 16 + 16) + (16 * 9 * 32 + 32) + (32 * 4 * 4 * 32 + 32) + 330
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
