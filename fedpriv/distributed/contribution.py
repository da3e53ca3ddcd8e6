"""One node's contribution to one distributed DP-SGD step, and the server's decoding.

The node draws its Poisson lot at rate q (the engine's samplers), computes each example's
gradient flattened in ``trainable_parameters`` order (``named_parameters``, trainable
only), clips it to C (non-finite examples add 0, as in the engine), scales it onto the
lattice, rounds it conditionally (norm ≤ Δ₂), sums the integers, adds its share of
discrete Gaussian noise and reduces mod 2^bits.  Secure aggregation sums the nodes'
vectors mod 2^bits; ``decode_sum`` centres that sum and divides by the scale: the noisy
clipped-gradient sum of the union lot, in gradient units, which the server divides by the
public expected lot before it steps.

Randomness, four independent sources: the lot, the rounding and the noise each from a
generator of its own (simulations), or all from the OS CSPRNG (``secure=True``).  The lot
size is private: ``Contribution.lot_size`` is for tests and the node's log, never sent.
Memory: B × d float64 per micro-batch, a few times over (B = ``max_physical_batch_size``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.distributed.lattice import Lattice, Rounding
from fedpriv.distributed.noise import discrete_gaussian
from fedpriv.distributed.rounding import nearest_rows, rounded_rows
from fedpriv.dpsgd.clipping import clip_factors, drop_rows, squared_norms
from fedpriv.dpsgd.config import Clipping, check_sample_rate
from fedpriv.dpsgd.engine import examples_at
from fedpriv.dpsgd.modules import check_model, trainable_parameters
from fedpriv.dpsgd.per_example import LossFn, per_example_gradients
from fedpriv.dpsgd.sampling import micro_batches, poisson_lot, secure_poisson_lot


@dataclass(frozen=True)
class Contribution:
    """``vector``: uint64 in [0, 2^bits), (Σ rounded clipped gradients + noise share) mod
    2^bits, what goes into secure aggregation.  ``lot_size``: private, never sent."""

    vector: np.ndarray
    lot_size: int


def distributed_contribution(
    model: nn.Module,
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    sample_rate: float,
    lattice: Lattice,
    noise_multiplier: float,
    honest_shares: int,
    sampling_generator: torch.Generator | None,
    rounding_generator: torch.Generator | None,
    noise_generator: np.random.Generator | None,
    secure: bool,
    loss_fn: LossFn = F.cross_entropy,
    max_physical_batch_size: int = 256,
) -> Contribution:
    """This node's encoded, noised clipped-gradient sum over one Poisson lot at
    ``sample_rate``, with noise share ``lattice.noise_stddev(noise_multiplier, honest_shares)``.

    ``secure``: lot, rounding and noise from the OS CSPRNG (pass no generators); else a
    torch generator for the lot (on the data's device), another for the rounding, and a
    numpy generator for the noise (unless σ = 0).
    """
    params = trainable_parameters(model)
    check_model(model)
    dimension = sum(p.numel() for p in params.values())
    if dimension != lattice.dimension:
        raise ValueError(f"the model has {dimension} trainable parameters, the lattice {lattice.dimension}")
    if len(features) != len(labels) or len(features) == 0:
        raise ValueError(f"need as many labels as features, at least one: {len(features)} vs {len(labels)}")
    if not isinstance(max_physical_batch_size, int) or max_physical_batch_size < 1:
        raise ValueError(f"max_physical_batch_size must be an integer >= 1, got {max_physical_batch_size!r}")
    noise_stddev = lattice.noise_stddev(noise_multiplier, honest_shares)
    _check_generators(secure, sampling_generator, rounding_generator, noise_generator, noise_stddev, features.device)
    check_sample_rate(sample_rate)
    if sampling_generator is None:  # secure (checked above)
        lot = secure_poisson_lot(len(features), sample_rate, features.device)
    else:
        lot = poisson_lot(len(features), sample_rate, sampling_generator)
    model.train()
    total = torch.zeros(dimension, dtype=torch.int64, device=features.device)
    for batch in micro_batches(lot, max_physical_batch_size):
        rows = clipped_rows(model, params, *examples_at(features, labels, batch), loss_fn, lattice.max_grad_norm)
        total += rounded_sum(rows, lattice, rounding_generator)
    return Contribution(vector=noised_vector(total.cpu().numpy(), lattice, noise_stddev, noise_generator),
                        lot_size=int(lot.numel()))


def rounded_sum(rows: torch.Tensor, lattice: Lattice, generator: torch.Generator | None) -> torch.Tensor:
    """(d,) int64: the sum of ``rows`` ((B, d) float64, each of norm ≤ C in gradient units;
    scaled in place) put on the lattice and rounded with ``lattice.rounding``, every rounded
    row of norm ≤ Δ₂. ``generator``: conditional rounding's draws (None: the OS CSPRNG)."""
    rows.mul_(lattice.scale)
    rounded = nearest_rows(rows, lattice.sensitivity) if lattice.rounding is Rounding.NEAREST else \
        rounded_rows(rows, lattice.sensitivity, generator)
    return rounded.sum(0).to(torch.int64)


def noised_vector(total: np.ndarray, lattice: Lattice, noise_stddev: float,
                  generator: np.random.Generator | None) -> np.ndarray:
    """What goes into secure aggregation: (``total`` + a discrete Gaussian share of std
    ``noise_stddev``) mod 2^bits, uint64 (``generator``: seeded numpy, or None for OpenDP)."""
    noisy = total + discrete_gaussian(noise_stddev, lattice.dimension, generator)
    return np.mod(noisy, lattice.modulus).astype(np.uint64)


def clipped_rows(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    features: torch.Tensor,
    labels: torch.Tensor,
    loss_fn: LossFn,
    max_grad_norm: float,
) -> torch.Tensor:
    """(B, d) float64: each example's flat gradient clipped to ``max_grad_norm`` (the engine's
    flat ``clip_factors``, in float64; non-finite examples are rows of 0)."""
    grads, _ = per_example_gradients(model, params, features, labels, loss_fn)
    rows = torch.cat([grads[name].reshape(len(features), -1) for name in params], dim=1).double()
    factors, keep = clip_factors([squared_norms(rows)], max_grad_norm, Clipping.FLAT)
    return drop_rows(rows, keep).mul_(factors[0].unsqueeze(1))


def decode_sum(modular_sum: np.ndarray, lattice: Lattice) -> torch.Tensor:
    """The flat float64 noisy clipped-gradient sum: ``modular_sum`` (the nodes' vectors summed
    mod 2^bits, each entry in [0, 2^bits)) centred into [−2^(bits−1), 2^(bits−1)), / scale."""
    if not isinstance(modular_sum, np.ndarray) or modular_sum.shape != (lattice.dimension,):
        raise ValueError(f"the modular sum must be an array of shape ({lattice.dimension},)")
    if modular_sum.dtype.kind not in "ui":
        raise ValueError(f"the modular sum must hold integers, got {modular_sum.dtype}")
    if modular_sum.size and (int(modular_sum.min()) < 0 or int(modular_sum.max()) >= lattice.modulus):
        raise ValueError(f"the modular sum's entries must be in [0, 2^{lattice.modulus_bits})")
    values = modular_sum.astype(np.int64)
    centred = np.where(values >= lattice.modulus // 2, values - lattice.modulus, values)
    return torch.from_numpy(centred.astype(np.float64) / lattice.scale)


def unflatten(flat: torch.Tensor, model: nn.Module) -> dict[str, torch.Tensor]:
    """``flat`` (d,) split into tensors shaped, typed and placed like ``model``'s trainable
    parameters, by name, in the contribution's order: e.g. each ``p.grad`` for a step."""
    params = trainable_parameters(model)
    sizes = [p.numel() for p in params.values()]
    if flat.shape != (sum(sizes),):
        raise ValueError(f"flat must have shape ({sum(sizes)},), got {tuple(flat.shape)}")
    return {
        name: part.view_as(p).to(dtype=p.dtype, device=p.device)
        for (name, p), part in zip(params.items(), flat.split(sizes), strict=True)
    }


def _check_generators(
    secure: bool,
    sampling: torch.Generator | None,
    rounding: torch.Generator | None,
    noise: np.random.Generator | None,
    noise_stddev: float,
    device: torch.device,
) -> None:
    if secure:
        if sampling is not None or rounding is not None or noise is not None:
            raise ValueError("secure draws lot, rounding and noise from the OS CSPRNG: pass no generators")
        return
    if sampling is None or rounding is None:
        raise ValueError("sampling_generator and rounding_generator are required unless secure=True")
    if sampling is rounding:
        raise ValueError("sampling and rounding must use separate generators")
    if noise is None and noise_stddev > 0:
        raise ValueError("noise_generator is required unless secure=True or noise_multiplier=0")
    if sampling.device.type != device.type:
        raise ValueError(f"sampling_generator is on {sampling.device} but the data are on {device}")
