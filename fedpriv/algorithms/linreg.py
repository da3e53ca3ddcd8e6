"""Linear regression by the functional mechanism (Zhang et al., VLDB 2012; seed paper 000).

The squared loss Σ_i (y_i − x̃_iᵀw)² of records scaled into [−1, 1] (x̃ = (x, 1): the last
weight is the intercept) is a polynomial in w whose coefficients are sums over records:
the quadratic part Σ x̃x̃ᵀ and the linear part −2 Σ y x̃. Releasing those sums with Laplace
noise releases the whole objective; minimising it is post-processing.

Sensitivities, replace-one adjacency, D = d + 1 weights (the paper's normalisation):
- quadratic monomials w_j w_l (j ≤ l) have coefficients x̃_j x̃_l (j = l) and 2 x̃_j x̃_l,
  whose absolute values sum to (Σ_j |x̃_j|)² ≤ D²: sensitivity 2D²;
- linear monomials w_j have coefficients −2 y x̃_j: sensitivity 4D.
Under add/remove adjacency (the ledger's) these are twice what is needed: sound, and the
numbers of the paper. ε is split into ε₁ (quadratic) and ε₂ (linear), each release's lattice
rounding inside its share (``laplace_scale``), so the two spend at most ε, not ε + 2.7e-10.

The noisy quadratic form need not be positive definite, so its minimiser may not exist.
It is projected onto the positive-definite cone: eigenvalues below the quadratic part's
noise scale are raised to it (a ridge of the size of the noise; Zhang et al.'s §5
discusses regularisation and spectral trimming), then w = M⁻¹ v.

Bounds of the features and the target are the *user's* (``Bounds``): bounds read off the
data would themselves leak it. Records outside them are clamped, NaN to the midpoint of its
range (``fedpriv.algorithms.box.clamp``): a NaN or ±∞ is never an error that depends on the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedpriv.algorithms.box import Box, clamp
from fedpriv.mechanisms import laplace_event, laplace_mechanism, laplace_scale, split_epsilon
from fedpriv.privacy.events import ComposedEvent, DpEvent


@dataclass(frozen=True)
class Bounds:
    """The user's stated ranges: per feature (``low``, ``high`` arrays) and of the target."""

    low: np.ndarray
    high: np.ndarray
    target: tuple[float, float]

    def __post_init__(self) -> None:
        Box(self.low, self.high)  # the features' ranges: the same checks
        t_low, t_high = self.target
        if not (np.isfinite(t_low) and np.isfinite(t_high) and t_low < t_high):
            raise ValueError(f"target bounds must be finite with low < high, got {self.target!r}")

    def scale_features(self, x: np.ndarray) -> np.ndarray:
        """Features clamped to the bounds and mapped to [−1, 1], with the intercept column."""
        unit = 2 * (clamp(x, self.low, self.high) - self.low) / (self.high - self.low) - 1
        return np.hstack([unit, np.ones((len(x), 1))])

    def scale_target(self, y: np.ndarray) -> np.ndarray:
        low, high = self.target
        return 2 * (clamp(y, low, high) - low) / (high - low) - 1

    def unscale_target(self, y: np.ndarray) -> np.ndarray:
        low, high = self.target
        return (y + 1) * (high - low) / 2 + low


@dataclass(frozen=True)
class Coefficients:
    """The loss polynomial's sums: quadratic monomials (upper triangle, off-diagonals
    doubled, flattened) and linear monomials, over some records."""

    quadratic: np.ndarray
    linear: np.ndarray

    def __add__(self, other: Coefficients) -> Coefficients:
        return Coefficients(self.quadratic + other.quadratic, self.linear + other.linear)


def sensitivities(num_features: int) -> tuple[float, float]:
    """(quadratic, linear) L1 sensitivities under replace-one adjacency: 2D², 4D."""
    weights = num_features + 1
    return 2.0 * weights**2, 4.0 * weights


def coefficients(x: np.ndarray, y: np.ndarray, bounds: Bounds) -> Coefficients:
    """The exact sums of records ``(x, y)`` brought into the bounds (``Bounds.scale_*``); a
    clear error on bad shapes (the request's, not the data's)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.ndim != 2 or y.shape != (len(x),) or x.shape[1] != len(bounds.low):
        raise ValueError(f"need x of shape (n, {len(bounds.low)}) and y of shape (n,), got {x.shape} and {y.shape}")
    xs, ys = bounds.scale_features(x), bounds.scale_target(y)
    rows, cols = np.triu_indices(xs.shape[1])
    monomials = xs[:, rows] * xs[:, cols] * np.where(rows == cols, 1.0, 2.0)
    return Coefficients(monomials.sum(axis=0), (-2.0 * ys[:, None] * xs).sum(axis=0))


SUM_BOUND = 1e12
"""Clamping bound of a coefficient *sum*: each record adds at most 2 in absolute value to
each, so no sum over fewer than 5·10¹¹ records is clamped."""


def _parts(num_features: int, epsilon: float, quadratic_share: float) -> tuple[tuple[int, float, float], ...]:
    """(size, L1 sensitivity, Laplace scale) of the quadratic and the linear release: ε split
    (share, 1 − share), each part's lattice rounding inside it, so the two spend at most ε."""
    size = num_features + 1
    sizes = (size * (size + 1) // 2, size)
    shares = split_epsilon(epsilon, (quadratic_share, 1 - quadratic_share))
    return tuple((n, s, laplace_scale(n, sensitivity=s, epsilon=e, bounds=(-SUM_BOUND, SUM_BOUND)))
                 for n, s, e in zip(sizes, sensitivities(num_features), shares, strict=True))


def release_event(num_features: int, epsilon: float, quadratic_share: float = 0.5) -> DpEvent:
    """What ``privatise`` costs, known before any data is touched (a node books it first)."""
    return ComposedEvent(tuple(laplace_event(n, sensitivity=s, scale=b, bounds=(-SUM_BOUND, SUM_BOUND))
                               for n, s, b in _parts(num_features, epsilon, quadratic_share)))


def privatise(sums: Coefficients, num_features: int, epsilon: float, quadratic_share: float = 0.5,
              rng: np.random.Generator | None = None) -> tuple[Coefficients, DpEvent]:
    """Laplace noise on both parts (ε·share and ε·(1 − share)); the event that cost."""
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not 0 < quadratic_share < 1:
        raise ValueError(f"quadratic_share must be in (0, 1), got {quadratic_share!r}")
    quad, lin = (laplace_mechanism(values, sensitivity=s, scale=b, bounds=(-SUM_BOUND, SUM_BOUND), rng=rng)
                 for values, (_, s, b) in zip((sums.quadratic, sums.linear),
                                              _parts(num_features, epsilon, quadratic_share), strict=True))
    return Coefficients(quad.values, lin.values), ComposedEvent((quad.event, lin.event))


def solve(noisy: Coefficients, num_features: int, noise_scale: float) -> np.ndarray:
    """Weights minimising the noisy objective after projecting its quadratic form onto the
    cone of matrices with eigenvalues ≥ ``noise_scale``."""
    size = num_features + 1
    rows, cols = np.triu_indices(size)
    matrix = np.zeros((size, size))
    matrix[rows, cols] = noisy.quadratic / np.where(rows == cols, 1.0, 2.0)
    matrix = np.triu(matrix) + np.triu(matrix, 1).T
    values, vectors = np.linalg.eigh(matrix)
    inverse = vectors @ np.diag(1.0 / np.maximum(values, noise_scale)) @ vectors.T
    return inverse @ (-noisy.linear / 2.0)


def predict(weights: np.ndarray, x: np.ndarray, bounds: Bounds) -> np.ndarray:
    """Predictions in the target's own units."""
    return bounds.unscale_target(bounds.scale_features(np.asarray(x, float)) @ weights)


def fit(x: np.ndarray, y: np.ndarray, bounds: Bounds, epsilon: float, quadratic_share: float = 0.5,
        rng: np.random.Generator | None = None) -> tuple[np.ndarray, DpEvent]:
    """ε-DP weights (scaled units, intercept last) and their event, centralized."""
    d = len(bounds.low)
    noisy, event = privatise(coefficients(x, y, bounds), d, epsilon, quadratic_share, rng)
    return solve(noisy, d, sensitivities(d)[0] / (epsilon * quadratic_share)), event
