"""White-box gradient canaries: Dirac gradients of norm C on coordinates no real example touches.

``CanaryModel`` wraps a model and appends m parameters, one per canary (a bias-free
``nn.Linear(m, 1)``, so book-keeping clipping supports it).  Its inputs are the wrapped
model's inputs flattened, plus one column: 0 for a real example, j + 1 for canary j.
A real example runs through the wrapped model only (the canary weights get exactly zero
gradient from it); canary j outputs logits whose value is 0 but whose derivative in canary
weight j is ``GAIN`` (``z − z.detach()``), and nothing of the wrapped model is selected for
it (``torch.where``: exactly zero gradient there).  With label 0 its cross-entropy gradient
is (1/K − 1)·GAIN·e_j, whose norm is far above C: clipped, it is exactly −C·e_j.

So a canary is an ordinary example to the engine: the Poisson sampler draws it, the clipper
clips it, the noise covers its coordinate like every other, and nothing else is touched.
What reaches canary weight j each step is the noise plus −C for each time canary j was in
the lot: ``observation`` turns an update into that count plus N(0, σ²) per step.
``SENTINELS`` more weights belong to no canary: pure noise, from which the adversary
estimates the σ it scores with (``noise_estimate``), rather than trusting the claimed one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

SENTINELS = 256
"""Extra coordinates no example ever touches: their updates are pure noise, from which the
adversary estimates the σ actually used (the claimed one may be a lie: the negative control)."""

MIN_NOISE = 1e-3
"""Floor of the estimated σ (an estimate of 0, training without noise, would divide by 0)."""

GAIN = 10.0
"""Canary gradient norm before clipping, in units of C: (1 − 1/K)·GAIN ≥ 1 for any K ≥ 2."""

CANARY_LABEL = 0


class CanaryModel(nn.Module):
    """``base`` plus one parameter per canary and ``SENTINELS`` more; see the module docstring."""

    ids: torch.Tensor

    def __init__(self, base: nn.Module, input_shape: tuple[int, ...], canaries: int, num_classes: int,
                 max_grad_norm: float) -> None:
        super().__init__()
        self.base, self.input_shape, self.num_classes = base, tuple(input_shape), num_classes
        self.canary = nn.Linear(canaries + SENTINELS, 1, bias=False)
        nn.init.zeros_(self.canary.weight)
        self.register_buffer("ids", torch.arange(1, canaries + SENTINELS + 1, dtype=torch.float32), persistent=False)
        self.gain = GAIN * max_grad_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        which = x[:, -1]
        logits = self.base(x[:, :-1].reshape(len(x), *self.input_shape))
        onehot = (which.unsqueeze(1) == self.ids).to(x.dtype) * self.gain
        z = self.canary(onehot)
        spike = nn.functional.pad(z - z.detach(), (0, self.num_classes - 1))  # value 0, slope in w_j
        return torch.where((which > 0).unsqueeze(1), spike, logits)

    def canary_weights(self) -> torch.Tensor:
        """The canary coordinates (m canaries, then the sentinels), detached (a copy)."""
        return self.canary.weight.detach()[0].clone()


class Recorder(torch.optim.SGD):
    """Plain SGD that keeps a copy of the canary weights' gradient before each step: every
    privatised update the adversary of DP-SGD sees (zeros where the engine set none)."""

    def __init__(self, model: CanaryModel, lr: float) -> None:
        super().__init__(model.parameters(), lr=lr)
        self.watched, self.seen = model.canary.weight, list[torch.Tensor]()

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        grad = self.watched.grad
        self.seen.append(torch.zeros(self.watched.shape[1]) if grad is None else grad.detach()[0].clone())
        return super().step(closure)


def with_canaries(features: torch.Tensor, labels: torch.Tensor, included: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features flattened with the canary column, labels) of the real examples followed by
    the included canaries, and those canaries' indices."""
    real = torch.cat([features.reshape(len(features), -1), features.new_zeros(len(features), 1)], dim=1)
    chosen = torch.nonzero(included).squeeze(1)
    rows = real.new_zeros(len(chosen), real.shape[1])
    rows[:, -1] = (chosen + 1).to(real.dtype)
    canary_labels = torch.full((len(chosen),), CANARY_LABEL, dtype=labels.dtype)
    return torch.cat([real, rows]), torch.cat([labels, canary_labels]), chosen


def observation(gradient: torch.Tensor, divisor: float, max_grad_norm: float) -> torch.Tensor:
    """The canary weights' privatised gradient (or a sum of several steps') as counts:
    ``−gradient · divisor / C``, the engine's divisor (q·ñ) undone: per step, the number of
    times the canary was in the lot plus N(0, σ²)."""
    return -gradient * divisor / max_grad_norm


def noise_estimate(sentinels: torch.Tensor, steps: int) -> float:
    """σ from sentinel observations (each a sum over ``steps`` steps of N(0, σ²)): the root
    mean square over √steps, at least ``MIN_NOISE``."""
    return max(MIN_NOISE, float(sentinels.to(torch.float64).square().mean().sqrt()) / math.sqrt(steps))


def log_likelihood_ratio(counts: torch.Tensor, steps: int, sample_rate: float, noise_multiplier: float
                         ) -> torch.Tensor:
    """ln of p_in / p_out for observations ``counts`` = c + N(0, steps·σ²), where c ~
    Binomial(steps, q) for a canary in and c = 0 for one out: the most powerful score
    (Neyman–Pearson) for what the adversary sees, summed over observations by the caller.
    σ is the adversary's ``noise_estimate``: the score is a function of the output alone."""
    c = torch.arange(steps + 1, dtype=torch.float64)
    log_binom = (torch.lgamma(torch.tensor(steps + 1.0)) - torch.lgamma(c + 1) - torch.lgamma(steps - c + 1)
                 + c * math.log(sample_rate) + (steps - c) * math.log1p(-sample_rate)
                 if sample_rate < 1 else torch.where(c == steps, 0.0, -math.inf))
    variance = steps * noise_multiplier**2
    x = counts.to(torch.float64).unsqueeze(-1)
    return torch.logsumexp(log_binom + (x * c - c**2 / 2) / variance, dim=-1)
