"""The engine on models it has not seen: each template's model, a GRU and a transformer
encoder get per-example clipped sums equal to per-example autograd (each example alone,
its gradient clipped by hand), in the path chosen per model; a model that mixes the
examples of a batch is refused before any step, by type or by the two-example test."""

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.dpsgd import DPSGDConfig, GradSampleMode, UnsupportedModuleError
from fedpriv.dpsgd.engine import clipped_sum_function, gradient_buffers
from fedpriv.dpsgd.modules import trainable_parameters
from fedpriv.dpsgd.recurrent import fix_recurrent
from fedpriv.dpsgd.validate import chosen_mode, validate_model

CLIP = 0.05  # below every example's gradient norm here: every example is clipped


class GRUClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(x)[0][:, -1])


class EncoderClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 16)
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embedding(tokens)).mean(1))


def _template(name):
    module = importlib.import_module(f"fedpriv.templates.{name}")
    return module.model


def _inputs(name, batch, generator):
    if name == "tabular":
        return torch.rand(batch, 30, generator=generator), 2
    if name == "image":
        return torch.randn(batch, 1, 8, 8, generator=generator), 10
    if name == "text":
        return torch.randint(0, 40, (batch, 12), generator=generator), 4
    if name == "gru":
        return torch.randn(batch, 5, 4, generator=generator), 3
    return torch.randint(0, 20, (batch, 6), generator=generator), 3


MODELS = {"tabular": _template("tabular"), "image": _template("image"), "text": _template("text"),
          "gru": lambda: fix_recurrent(GRUClassifier()), "encoder": EncoderClassifier}
EXPECTED = {"tabular": GradSampleMode.BOOKKEEPING, "image": GradSampleMode.BOOKKEEPING,
            "text": GradSampleMode.VMAP, "gru": GradSampleMode.VMAP, "encoder": GradSampleMode.VMAP}


def _by_autograd(model, x, y):
    """Σ_i clip(g_i), each g_i from a batch of one example alone."""
    params = list(trainable_parameters(model).values())
    total = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    for i in range(len(y)):
        grads = torch.autograd.grad(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), params)
        norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads))
        factor = min(1.0, CLIP / float(norm))
        assert factor < 1.0  # the clipping is exercised
        for t, g in zip(total, grads):
            t += factor * g.double()
    return total


@pytest.mark.parametrize("name", sorted(MODELS))
def test_clipped_sums_equal_per_example_autograd(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    generator = torch.Generator().manual_seed(1)
    x, classes = _inputs(name, 7, generator)
    y = torch.randint(0, classes, (7,), generator=generator)
    assert chosen_mode(model) is EXPECTED[name]
    validate_model(model, x[0], x[1])  # keeps examples apart: accepted
    params = trainable_parameters(model)
    config = DPSGDConfig(noise_multiplier=1.0, max_grad_norm=CLIP, sample_rate=0.5, max_physical_batch_size=7)
    flat, into = gradient_buffers(params)
    flat.zero_()
    model.train()
    with clipped_sum_function(model, params, F.cross_entropy, config) as clipped_sum:
        clipped_sum(x, y, into)
    for got, want in zip(into, _by_autograd(model, x, y)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)


def test_batchnorm_is_refused_with_the_fix():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    with pytest.raises(UnsupportedModuleError, match="GroupNorm") as caught:
        validate_model(model, torch.randn(4), torch.randn(4))
    assert "\n" not in str(caught.value)


class BatchCentring(nn.Module):
    """Subtracts the batch mean: mixes examples without being a known layer type."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0, keepdim=True)


class PerExampleCentring(nn.Module):
    """Subtracts each example's own mean: no mixing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(1, keepdim=True)


def test_a_layer_that_mixes_examples_is_found_by_the_two_example_test():
    model = nn.Sequential(nn.Linear(4, 8), BatchCentring(), nn.Linear(8, 2))
    with pytest.raises(UnsupportedModuleError, match="mixes the examples of a batch.*LayerNorm"):
        validate_model(model, torch.randn(4), torch.randn(4))
    validate_model(nn.Sequential(nn.Linear(4, 8), PerExampleCentring(), nn.Linear(8, 2)), torch.randn(4),
                   torch.randn(4))


def test_dropout_is_not_taken_for_mixing_and_integer_inputs_are_varied():
    validate_model(nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2)), torch.randn(4), torch.randn(4))

    class TokenMixer(nn.Module):  # embeds, then averages over the batch: mixing on integer inputs
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(10, 4)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            e = self.embedding(tokens).mean(1)
            return e + e.mean(0, keepdim=True)

    same = torch.tensor([1, 2, 3])
    with pytest.raises(UnsupportedModuleError, match="mixes"):
        validate_model(TokenMixer(), same, same)  # identical examples: the second's tokens are moved


def test_gru_and_rnn_are_swapped_for_the_same_computation_over_the_same_parameters():
    torch.manual_seed(0)
    for rnn in (nn.GRU(4, 8, num_layers=2, bidirectional=True, batch_first=True),
                nn.RNN(4, 8, nonlinearity="relu", bias=False)):
        state = {k: v.clone() for k, v in rnn.state_dict().items()}
        layers = rnn.num_layers * (2 if rnn.bidirectional else 1)
        x, h0 = torch.randn(3, 5, 4), torch.randn(layers, 3 if rnn.batch_first else 5, 8)
        expected = rnn(x, h0)
        fixed = fix_recurrent(rnn)
        assert type(fixed) is not type(rnn) and fixed.state_dict().keys() == state.keys()
        for got, want in zip(fixed(x, h0), expected):
            torch.testing.assert_close(got, want)
