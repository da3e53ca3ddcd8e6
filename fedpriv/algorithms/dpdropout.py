"""Differentially private dropout (Ermiş & Cemgil, Algorithm 1) and the paper's two
baselines, all as compositions of fedpriv's DP-SGD engine on one network: input → H
ReLU units → 10 classes (H = 1000 MNIST, 500 DIGITS).

- ``dpd``: Gaussian dropout on the hidden units (each multiplied by ξ ~ N(1, α),
  α = p/(1 − p), a mask per example, train only) + per-layer clipping at C + Gaussian
  noise of std 2Cσ on the clipped sum + the SGLD step θ ← θ − (η_t/2)·(noisy sum)/(q·N)
  with η_t = η0/t, t the epoch (the paper updates η "per round").
- ``sgld``: the same without dropout (the paper's "SGLD, no dropout" row).
- ``dpsgd``: Abadi et al.: flat clipping of the whole gradient at C·√K, the same noise,
  constant step η0, no dropout.

**What is booked.** The network has K = 4 parameter tensors (two weights, two biases);
"per layer" here is per tensor, each clipped at C (``Clipping.PER_LAYER`` with
``max_grad_norm = C·√K``), so one example's whole gradient is at most C·√K = 2C. That is
the L2 sensitivity of the clipped sum under **add/remove** adjacency (the ledgers'), and the
engine adds N(0, (σ·C·√K)²) = N(0, 4C²σ²) to it: exactly the paper's noise, delivering
noise multiplier σ, so each step books ``dpsgd_event(σ, q, ·)`` — never less than the noise
gives. The paper's "2C" is the replace-one sensitivity of one layer; replace-one of the whole
gradient would be 4C (group privacy of two add/remove steps covers it). ``dpsgd`` clips the
whole gradient at the same 2C, so all three methods book the same event for the same σ.

σ comes from a sound accountant (``calibrate``); the paper's zCDP arithmetic lives,
labelled, in ``fedpriv.privacy.dpdropout``. The dropout noise is data-independent: it costs
and gives no privacy (its generator is separate from lots and DP noise all the same).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedpriv.dpsgd import DPSGDConfig, steps_per_epoch, train_dpsgd
from fedpriv.dpsgd.config import Clipping, GradSampleMode, check_sample_rate
from fedpriv.privacy import calibrate_noise_multiplier
from fedpriv.privacy.events import DpEvent
from fedpriv.seeding import derive_seed, generator

METHODS = ("dpd", "sgld", "dpsgd")
NUM_CLASSES = 10
NUM_TENSORS = 4
"""Weights and biases of the two Linear layers: K in C·√K."""
DIGITS_FEATURES = 64


@dataclass(frozen=True)
class Settings:
    """One method's hyper-parameters. ``max_grad_norm`` is the paper's per-layer C;
    ``lr`` is η0; ``dropout`` is Gaussian dropout's p (``dpd`` only, in [0, 1)).
    ``fixed_sample_rate``: Poisson rate q whatever N (a federated node takes the server's,
    set from a public size, never its own N); None: q = lot / N."""

    method: str
    hidden: int
    max_grad_norm: float
    lot_size: int
    epochs: int
    lr: float
    dropout: float = 0.0
    fixed_sample_rate: float | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        for name in ("hidden", "lot_size", "epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("max_grad_norm", "lr"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be finite and > 0, got {getattr(self, name)!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.dropout and self.method != "dpd":
            raise ValueError(f"{self.method} has no dropout (only dpd)")
        if self.fixed_sample_rate is not None:
            check_sample_rate(self.fixed_sample_rate, "fixed_sample_rate")

    def sample_rate(self, num_examples: int) -> float:
        """q = lot / N (Poisson lots of that expected size), or the fixed rate."""
        return self.fixed_sample_rate or min(1.0, self.lot_size / num_examples)

    def steps(self, num_examples: int, epochs: int | None = None) -> int:
        """Steps of ``epochs`` (default: all) epochs over N examples."""
        return (self.epochs if epochs is None else epochs) * steps_per_epoch(self.sample_rate(num_examples))

    def learning_rate(self, epoch: int) -> float:
        """The step size in (1-based) ``epoch``: η0/(2t) for dpd and sgld, η0 for dpsgd."""
        return self.lr if self.method == "dpsgd" else self.lr / (2 * epoch)

    def engine_config(self, noise_multiplier: float, num_examples: int, secure_mode: bool = False) -> DPSGDConfig:
        """The engine's config: noise std σ·C·√K on a sum of per-example gradients of norm ≤ C·√K."""
        return DPSGDConfig(noise_multiplier=noise_multiplier, max_grad_norm=self.max_grad_norm * math.sqrt(NUM_TENSORS),
                           sample_rate=self.sample_rate(num_examples),
                           clipping=Clipping.FLAT if self.method == "dpsgd" else Clipping.PER_LAYER,
                           secure_mode=secure_mode, grad_sample_mode=GradSampleMode.BOOKKEEPING)


PAPER = {
    "mnist": dict(hidden=1000, max_grad_norm=3.0, lot_size=600, epochs=200, lr=0.1),
    "digits": dict(hidden=500, max_grad_norm=2.0, lot_size=100, epochs=100, lr=0.05),
}
"""Section 5's settings (the paper gives no dropout rate and no Abadi et al. learning rate)."""

DEFAULTS: dict[tuple[str, str], dict[str, float | int]] = {
    ("digits", "dpd"): dict(lot_size=400, epochs=6, max_grad_norm=0.5, lr=16.0, dropout=0.05),
    ("digits", "sgld"): dict(lot_size=400, epochs=6, max_grad_norm=0.5, lr=16.0),
    ("digits", "dpsgd"): dict(lot_size=700, epochs=6, max_grad_norm=0.5, lr=2.0),
    ("mnist", "dpd"): dict(epochs=10, max_grad_norm=1.0, lr=4.0, dropout=0.05),
    ("mnist", "sgld"): dict(epochs=10, max_grad_norm=1.0, lr=4.0),
    ("mnist", "dpsgd"): dict(epochs=10, max_grad_norm=1.0, lr=1.0),
}
"""Tuned departures from ``PAPER`` per (dataset, method): DIGITS chosen at ε = 1 on a
validation split of the training set, MNIST from three tries at ε = 1 (docs/dpdropout.md).
The search is not private: it looked at the data many times, outside every ledger."""


def settings(dataset: str, method: str, **overrides: float | int | None) -> Settings:
    """The paper's settings for ``dataset``, the tuned defaults, then ``overrides`` (None: keep)."""
    if dataset not in PAPER:
        raise ValueError(f"dataset must be one of {', '.join(PAPER)}, got {dataset!r}")
    chosen: dict[str, Any] = {**PAPER[dataset], **DEFAULTS.get((dataset, method), {})}  # Settings checks each type
    chosen.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(method=method, **chosen)


@functools.cache
def calibrate(settings_: Settings, epsilon: float, delta: float, num_examples: int, accountant: str = "rdp") -> float:
    """The smallest σ whose whole training (``dpsgd_event(σ, q, steps)``) reaches ε at δ
    (cached: a table asks again for every seed)."""
    return calibrate_noise_multiplier(epsilon, delta, settings_.sample_rate(num_examples),
                                      settings_.steps(num_examples), accountant=accountant)


class GaussianDropout(nn.Module):
    """x·ξ with ξ ~ N(1, α), α = p/(1 − p), drawn per entry (so per example) from its own
    generator while training; the identity in eval mode (E[ξ] = 1, no rescaling)."""

    def __init__(self, p: float, generator_: torch.Generator | None = None) -> None:
        super().__init__()
        self.std = math.sqrt(p / (1 - p))
        self.generator = generator_

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.std == 0:
            return x
        noise = torch.randn(x.shape, generator=self.generator, dtype=x.dtype, device=x.device)
        return x * (1 + self.std * noise)


def network(in_features: int, settings_: Settings, seed: int) -> nn.Sequential:
    """The one-hidden-layer network, initialised from ``seed`` (``train`` seeds dpd's dropout)."""
    torch.manual_seed(derive_seed(seed, "model"))
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(in_features, settings_.hidden), nn.ReLU()]
    if settings_.dropout:
        layers.append(GaussianDropout(settings_.dropout))
    return nn.Sequential(*layers, nn.Linear(settings_.hidden, NUM_CLASSES))


def train(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, settings_: Settings,
          noise_multiplier: float, *, seed: int | None, epochs: range | None = None,
          expected_lot_size: float | None = None,
          progress: Callable[[int, float], None] | None = None) -> tuple[DpEvent, ...]:
    """Train ``model`` in place for ``epochs`` (1-based epoch numbers; default all of them),
    one engine call per epoch with that epoch's step size; return the events (one per epoch).

    ``seed``: lots, DP noise and dropout from three derived streams (a simulation); None: lots
    and noise from the OS CSPRNG (the engine's secure mode), dropout from an OS-seeded stream.
    ``expected_lot_size``: the divisor of the noisy sum (default q·N; pass q·ñ where N is private).
    ``progress(epoch, mean_loss)`` after each epoch.
    """
    num_examples = len(labels)
    config = settings_.engine_config(noise_multiplier, num_examples, secure_mode=seed is None)
    sampling, noise = (None, None) if seed is None else (
        generator(seed, "dpdropout", "sampling"), generator(seed, "dpdropout", "noise")
    )
    dropout_seed = int.from_bytes(os.urandom(8), "big") if seed is None else derive_seed(seed, "dpdropout", "dropout")
    for module in model.modules():
        if isinstance(module, GaussianDropout):
            module.generator = torch.Generator(device=features.device).manual_seed(dropout_seed)
    events: list[DpEvent] = []
    for epoch in range(1, settings_.epochs + 1) if epochs is None else epochs:
        optimizer = torch.optim.SGD(model.parameters(), lr=settings_.learning_rate(epoch))
        report = train_dpsgd(model, features, labels, config=config, steps=steps_per_epoch(config.sample_rate),
                             optimizer=optimizer, expected_lot_size=expected_lot_size,
                             sampling_generator=sampling, noise_generator=noise)
        events.extend(report.events)
        if progress is not None:
            progress(epoch, report.mean_loss)
    return tuple(events)


def parameter_count(in_features: int, hidden: int) -> int:
    """Weights and biases of the network: the length of a federated node's reply."""
    return (in_features + 1) * hidden + (hidden + 1) * NUM_CLASSES


def digits_features(pixels: np.ndarray) -> torch.Tensor:
    """DIGITS as ``fedpriv.algorithms.datasets`` holds it (64 pixels of 0..16 per row) in
    [0, 1], as ``fedpriv.data`` gives it to the centralized runs."""
    return torch.as_tensor(np.asarray(pixels) / 16.0, dtype=torch.float32)


@torch.no_grad()
def accuracy(model: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> float:
    """Test accuracy (eval mode: no dropout)."""
    model.eval()
    return float((model(features).argmax(dim=1) == labels).float().mean())
