"""Private data normalisation (Tramèr & Boneh 2021): each input channel's mean and standard
deviation, estimated with the Gaussian mechanism, its cost reported as events.

Every example gives its per-channel mean m_i and mean square s_i (one value per channel,
over the channel's other dimensions); each of the two vectors is clipped to L2 norm
≤ ``bound``, so each sum has sensitivity ``bound`` under add/remove.  The released sums
Σ clip(m_i) + N(0, σ²bound²·I) and Σ clip(s_i) + N(0, σ²bound²·I), divided by the public N
(as the engine divides by q·N), give the mean and E[x²]; the variance is E[x²] − mean²,
at least 0.  Two Gaussian mechanisms: ``normalisation_events(σ)``, to be composed with
training's (``calibrate_plan(prior_events=...)``).  Whatever is then computed from the
released statistics (normalising the training and test inputs) is post-processing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedpriv.dpsgd.noise import fill_gaussian_noise_
from fedpriv.privacy.events import DpEvent, GaussianEvent

EPS = 1e-5
"""Added to the variance before the square root (as BatchNorm does): a channel whose noisy
variance is 0 is scaled by at most 1/√EPS."""


@dataclass(frozen=True)
class ChannelNormalisation:
    """(x − mean) / std per channel (dim 1) of a batch of inputs."""

    mean: torch.Tensor  # (C,)
    std: torch.Tensor  # (C,)

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        shape = (1, -1, *[1] * (inputs.dim() - 2))
        return (inputs - self.mean.view(shape)) / self.std.view(shape)


def normalisation_events(noise_multiplier: float) -> tuple[DpEvent, ...]:
    """What ``private_normalisation`` spends: two Gaussian mechanisms of multiplier σ."""
    return (GaussianEvent(noise_multiplier), GaussianEvent(noise_multiplier))


def private_normalisation(
    inputs: torch.Tensor, noise_multiplier: float, generator: torch.Generator | None, bound: float = 1.0
) -> ChannelNormalisation:
    """The per-channel normalisation of ``inputs`` (N, C, ...) from clipped, noised statistics.

    ``generator`` draws the noise (seeded runs); None: the OS CSPRNG.  σ > 0 and ``bound`` > 0.
    """
    if not noise_multiplier > 0 or not bound > 0:
        raise ValueError(f"need noise_multiplier > 0 and bound > 0, got {noise_multiplier!r}, {bound!r}")
    per_example = inputs.reshape(len(inputs), inputs.shape[1], -1).double()
    released = []
    for statistic in (per_example.mean(2), per_example.square().mean(2)):  # (N, C) each
        clipped = statistic * (bound / statistic.norm(dim=1, keepdim=True).clamp(min=bound))
        noisy = torch.empty(statistic.shape[1], dtype=torch.float64, device=inputs.device)
        fill_gaussian_noise_(noisy, noise_multiplier * bound, generator, secure_mode=generator is None)
        released.append((noisy + clipped.sum(0)) / len(inputs))
    mean, mean_square = released
    std = ((mean_square - mean.square()).clamp(min=0) + EPS).sqrt()
    return ChannelNormalisation(mean.to(inputs.dtype), std.to(inputs.dtype))
