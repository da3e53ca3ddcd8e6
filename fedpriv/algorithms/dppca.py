"""Differentially private PCA (Abadi et al. 2016, §4): a projection learnt from a noisy
second-moment matrix, the input layer of their MNIST MLP.

**Release.** A Poisson sample of the records (each kept with probability ``sample_rate``),
each flattened and scaled to unit L2 norm (a zero record stays zero: norm ≤ 1 either way; a
record holding a NaN or ±∞ becomes the zero record, a fixed per-record rule, never an error),
and the d × d matrix A = Σ x xᵀ over the sample, released as A + G with G's d² entries
i.i.d. N(0, σ²), then symmetrised: (A + G + (A + G)ᵀ)/2 = A + (G + Gᵀ)/2 (post-processing;
the noise on the diagonal is N(0, σ²), off it N(0, σ²/2)). This is Abadi et al.'s own
construction (their code adds noise to the flattened matrix, then symmetrises).

**Sensitivity.** Adding or removing one record x moves A by x xᵀ, whose Frobenius norm
(the L2 norm of the released d² entries) is ‖x‖² ≤ 1: ``SENSITIVITY = 1``, reached by every
non-zero record. Had the noise been drawn on the upper triangle and mirrored, the release
would be that triangle (sensitivity √(½(‖x‖⁴ + Σ x_i⁴)) ≤ 1, reached at a basis vector) with
σ² off the diagonal: the same guarantee, twice the off-diagonal variance.

**Cost.** ``GaussianEvent(σ)``, or ``PoissonSampledEvent(q, GaussianEvent(σ))`` when
q < 1. The projection is the top ``dims`` eigenvectors of the noisy matrix
(post-processing). Across nodes, each releases the noisy matrix of its own records and
the server adds them: every node's noise is its own (σ each, the sum's √K·σ).

Noise comes from a seeded ``torch.Generator`` (simulations; never the sampling one) or
from the OS CSPRNG (``secure_mode``), through DP-SGD's own samplers.

**The MLP.** The model's inputs are ``project(x, P, INPUT_SCALE)``; ``train_mlp`` runs
DP-SGD (``fedpriv.dpsgd.train_dpsgd``) on them, as one node does in a federated round.
A projection a node receives is untrusted: ``check_projection`` accepts only a finite
(features × dims) matrix with orthonormal columns. Privacy does not rest on it (DP-SGD
clips every example's gradient, whatever its inputs); it keeps a garbage matrix out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.dpsgd.config import check_sample_rate
from fedpriv.dpsgd.noise import fill_gaussian_noise_
from fedpriv.dpsgd.sampling import poisson_lot, secure_poisson_lot
from fedpriv.privacy import GaussianEvent, PoissonSampledEvent, calibrate_noise_multiplier
from fedpriv.privacy.events import DpEvent

SENSITIVITY = 1.0
"""L2 (Frobenius) sensitivity of Σ x xᵀ over unit-norm records, under add/remove of one."""

INPUT_SCALE = 10.0
"""Projected unit-norm images have norm ≤ 1; ×10 (a public constant) brings them near the
norm of an MNIST image in [0, 1] pixels, which the MLP's default LR and init suit (×1 trained
to 94 % without noise in 15 epochs, ×10 to 98 %)."""

ORTHONORMAL_TOLERANCE = 1e-3
"""How far PᵀP of a received projection may be from the identity (float32 rounding is ~1e-6)."""


@dataclass(frozen=True)
class NoisyMoment:
    """A released noisy second-moment matrix (symmetric, float64) and what it cost."""

    matrix: torch.Tensor
    event: DpEvent


def _check_records(x: torch.Tensor) -> torch.Tensor:
    """Records flattened (n × d, float64); one holding a NaN or ±∞ becomes zero."""
    if not isinstance(x, torch.Tensor) or x.ndim < 2:
        raise ValueError(f"records must be a tensor of shape (n, ...), got {getattr(x, 'shape', type(x))}")
    flat = x.flatten(1).to(torch.float64)
    if flat.shape[1] < 1:
        raise ValueError("records must have at least one coordinate")
    return torch.where(torch.isfinite(flat).all(dim=1, keepdim=True), flat, 0.0)


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Records flattened (n × d, float64), each scaled to unit L2 norm; zero records (and
    non-finite ones, zeroed) stay zero.

    Divided by its largest |entry| first, so that no norm under- or overflows (a subnormal
    or a 1e300 record is scaled like any other)."""
    flat = _check_records(x)
    largest = flat.abs().amax(dim=1, keepdim=True)
    flat = flat / torch.where(largest > 0, largest, 1.0)
    norms = flat.norm(dim=1, keepdim=True)
    return flat / torch.where(norms > 0, norms, 1.0)


def second_moment(x: torch.Tensor) -> torch.Tensor:
    """Σ x xᵀ over the unit-norm records: the statistic DP-PCA releases (d × d, float64)."""
    rows = unit_rows(x)
    return rows.T @ rows


def pca_event(noise_multiplier: float, sample_rate: float = 1.0) -> DpEvent:
    """The cost of one release: the Gaussian mechanism, on a Poisson sample when q < 1."""
    check_sample_rate(sample_rate)
    gaussian = GaussianEvent(float(noise_multiplier))
    return gaussian if sample_rate == 1 else PoissonSampledEvent(float(sample_rate), gaussian)


def calibrate_pca_noise(epsilon: float, delta: float, sample_rate: float = 1.0) -> float:
    """Smallest σ (3 significant digits, rounded up) whose release alone costs ≤ ε at δ (RDP).

    One Poisson-sampled step of DP-SGD is the same mechanism, so DP-SGD's calibration serves.
    """
    return calibrate_noise_multiplier(epsilon, delta, sample_rate, steps=1)


def noisy_second_moment(
    x: torch.Tensor,
    noise_multiplier: float,
    sample_rate: float = 1.0,
    *,
    sampling_generator: torch.Generator | None = None,
    noise_generator: torch.Generator | None = None,
    secure_mode: bool = False,
) -> NoisyMoment:
    """Release Σ x xᵀ over a Poisson sample of unit-norm records, plus symmetric Gaussian noise.

    Generators (CPU): ``sampling_generator`` when q < 1, and ``noise_generator`` unless σ = 0; with
    ``secure_mode`` neither (sample and noise from the OS CSPRNG; passing one is an error).
    """
    event = pca_event(noise_multiplier, sample_rate)  # validates σ and q
    if secure_mode and (sampling_generator is not None or noise_generator is not None):
        raise ValueError("secure_mode draws from the OS CSPRNG: pass no generators")
    if not secure_mode and noise_generator is None and noise_multiplier != 0:
        raise ValueError("a noise_generator is required unless secure_mode=True or noise_multiplier=0")
    if not secure_mode and sample_rate < 1 and sampling_generator is None:
        raise ValueError("a sampling_generator is required for sample_rate < 1 unless secure_mode=True")
    if noise_generator is not None and noise_generator is sampling_generator:
        raise ValueError("the noise must not share a generator with the sampling")
    rows = _check_records(x)
    if sample_rate < 1:
        if secure_mode:
            lot = secure_poisson_lot(len(rows), sample_rate, "cpu")
        elif sampling_generator is not None:
            lot = poisson_lot(len(rows), sample_rate, sampling_generator)
        else:  # refused above already
            raise ValueError("a sampling_generator is required for sample_rate < 1 unless secure_mode=True")
        rows = rows[lot.to(rows.device)]
    moment = second_moment(rows)
    d = moment.shape[0]
    noise = torch.empty(d * d, dtype=torch.float64)
    fill_gaussian_noise_(noise, noise_multiplier * SENSITIVITY, noise_generator, secure_mode)
    noise = noise.view(d, d).to(moment.device)
    return NoisyMoment((moment + noise + (moment + noise).T) / 2, event)


def principal_projection(moment: torch.Tensor, dims: int) -> torch.Tensor:
    """The top-``dims`` eigenvectors of a symmetric matrix, as columns (d × dims, float32)."""
    if moment.ndim != 2 or moment.shape[0] != moment.shape[1]:
        raise ValueError(f"moment must be a square matrix, got shape {tuple(moment.shape)}")
    if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= moment.shape[0]:
        raise ValueError(f"dims must be an integer in [1, {moment.shape[0]}], got {dims!r}")
    if not torch.isfinite(moment).all():
        raise ValueError("moment must be finite (NaN or ∞ found)")
    _, vectors = torch.linalg.eigh(moment.to(torch.float64))  # ascending eigenvalues
    return vectors[:, -dims:].flip(1).to(torch.float32).contiguous()


def project(x: torch.Tensor, projection: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The model's inputs: unit-norm records times the projection, times ``scale`` (float32)."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale!r}")
    rows = unit_rows(x)
    if rows.shape[1] != projection.shape[0]:
        raise ValueError(f"records have {rows.shape[1]} coordinates, the projection {projection.shape[0]}")
    return (rows.to(torch.float32) @ projection.to(rows.device)) * scale


def check_projection(projection: np.ndarray | torch.Tensor, features: int) -> torch.Tensor:
    """A projection received from elsewhere (untrusted), as float32: a finite
    (``features`` × dims) matrix, 1 ≤ dims ≤ features, with orthonormal columns
    (‖PᵀP − I‖_max ≤ ``ORTHONORMAL_TOLERANCE``); ``ValueError`` otherwise."""
    matrix = torch.as_tensor(np.asarray(projection, dtype=np.float64))
    if matrix.ndim != 2 or matrix.shape[0] != features or not 1 <= matrix.shape[1] <= features:
        raise ValueError(f"projection must have shape ({features}, dims) with 1 ≤ dims ≤ {features}, "
                         f"got {tuple(matrix.shape)}")
    if not torch.isfinite(matrix).all():
        raise ValueError("projection must be finite (NaN or ∞ found)")
    gram = matrix.T @ matrix
    if (gram - torch.eye(matrix.shape[1], dtype=torch.float64)).abs().max() > ORTHONORMAL_TOLERANCE:
        raise ValueError("projection's columns must be orthonormal")
    return matrix.to(torch.float32).contiguous()


def train_mlp(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, *, noise_multiplier: float,
              sample_rate: float, steps: int, max_grad_norm: float, lr: float, seeds: tuple[int, int] | None,
              expected_lot_size: float | None = None, momentum: float = 0.9) -> tuple[DpEvent, ...]:
    """``steps`` DP-SGD steps (SGD with ``momentum``) of ``model`` on projected inputs; their
    events. ``seeds`` (sampling, noise) seed two generators (a simulation); ``None``: lots
    and noise from the OS CSPRNG. ``expected_lot_size``: the noisy sum's divisor (q × a
    public size where N is private)."""
    config = DPSGDConfig(noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, sample_rate=sample_rate,
                         secure_mode=seeds is None)
    sampling, noise = (None, None) if seeds is None else (torch.Generator().manual_seed(s) for s in seeds)
    report = train_dpsgd(model, inputs, labels, config=config, steps=steps,
                         optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                         sampling_generator=sampling, noise_generator=noise, expected_lot_size=expected_lot_size)
    return report.events
