"""The pure steps of a central user-level round (``server.userlevel``, ``clients.userlevel``),
one copy that the apps and the audit (``fedpriv.audit.dpsgd_modes``) both call.

- ``clipped_delta``: the node's model delta, scaled to L2 norm ≤ S, and the bit 1[‖Δ‖ ≤ S];
  ``sent_delta``: that delta as the node sends it, in the model's dtypes.
- ``RoundNoise``: the server's draws for one round (cohort uniforms, then the noise).
- ``noisy_step``: the server's update, model + (Σ clipped deltas + N(0, std²)) / m.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from fedpriv.dpsgd.csprng import secure_uniform
from fedpriv.dpsgd.noise import secure_normal
from fedpriv.federation.settings import ServerRandomness
from fedpriv.seeding import derive_seed


def clipped_delta(before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor],
                  clip: float) -> tuple[dict[str, np.ndarray], int]:
    """(after − before) in float64, scaled to L2 norm ≤ ``clip``, and 1[‖Δ‖ ≤ clip]."""
    deltas = {name: after[name].detach().cpu().double().numpy() - before[name].double().numpy() for name in before}
    norm = math.sqrt(sum(float(np.sum(d * d)) for d in deltas.values()))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {name: d * scale for name, d in deltas.items()}, int(norm <= clip)


def sent_delta(deltas: Mapping[str, np.ndarray], before: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Float64 ``deltas`` cast to the dtypes of the model ``before`` (what goes on the wire)."""
    return {name: d.astype(before[name].numpy().dtype) for name, d in deltas.items()}


class RoundNoise:
    """The server's draws for one round: seeded (``numpy.random.default_rng(derive_seed(seed,
    "user-level", r))``, reproducible from the run's seed) or from the OS CSPRNG."""

    def __init__(self, randomness: ServerRandomness, seed: int, server_round: int) -> None:
        self.rng = np.random.default_rng(derive_seed(seed, "user-level", server_round)) \
            if randomness is ServerRandomness.SEEDED else None

    def uniform(self, size: int) -> np.ndarray:
        return self.rng.random(size) if self.rng is not None else secure_uniform(size).numpy()

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        size = math.prod(shape)
        draws = self.rng.standard_normal(size) * std if self.rng is not None else secure_normal(size, std).numpy()
        return draws.reshape(shape)


def noisy_step(model: Mapping[str, np.ndarray], deltas: Sequence[Mapping[str, np.ndarray]], noise: RoundNoise,
               std: float, expected_cohort: float) -> dict[str, np.ndarray]:
    """The released model: per array (in ``model``'s order), model + (Σ ``deltas`` in float64,
    in the given order, + N(0, std²) per coordinate) / ``expected_cohort``, in the array's
    dtype. The noise is added always, also to an empty sum."""
    out = {}
    for name, array in model.items():
        total = sum((np.asarray(delta[name]).astype(np.float64) for delta in deltas),
                    np.zeros(array.shape, dtype=np.float64))
        total += noise.normal(tuple(array.shape), std)
        out[name] = (array.astype(np.float64) + total / expected_cohort).astype(array.dtype)
    return out
