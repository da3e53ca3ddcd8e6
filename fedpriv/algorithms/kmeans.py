"""DP k-means from seed paper 002: DPLloyd (central) and input perturbation (local DP).

Both need the data's bounds from the *user* (``low``, ``high`` per coordinate): records
are clamped to them (NaN to the midpoint: ``Box.clamp``), never used to set them.

**DPLloyd** (Blum et al.'s SuLQ k-means, as in Su et al. 2016): a fixed number T of Lloyd
iterations, each releasing every cluster's count and coordinate sum with Laplace noise.
Initial centroids drawn uniformly from the box (data-independent) leave Lloyd far from the
data when the box is loose (iris in [0, 8]^4: 0.71 clustering accuracy even *without*
noise), so a first release spends a share ε/(T + 1) on the data's noisy count, coordinate
sums and sums of squares, and the k initial centroids are drawn from the Gaussian with
that mean and per-coordinate spread (a public seed picks the draws): L1 sensitivity
1 + Σ_j r_j + Σ_j r_j².
Coordinates are centred on the box's midpoint, so |x_j| ≤ r_j (half the range); adding or
removing one record (the ledger's adjacency) moves one count by 1 and one cluster's sum by
at most Σ_j r_j: L1 sensitivity 1 + Σ_j r_j for the whole release, ε/(T + 1) per iteration.
The T + 1 shares add up to at most ε exactly, each release's lattice rounding inside its
share (``split_epsilon``, ``laplace_scale``): ε = 1 costs 1, not 1 + 2.6e-9.
A cluster whose noisy count is below 1 keeps its previous centroid (no division by a
small or negative number: no NaN or ∞); centroids are clamped to the box.

**Input perturbation**: each record gets Laplace noise of L1 sensitivity Σ_j (high_j −
low_j) (any record can be replaced by any other), then ordinary k-means: ε-local DP, the
baseline that trusts no one.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from fedpriv.algorithms.box import Box
from fedpriv.mechanisms import LaplaceRelease, laplace_event, laplace_mechanism, laplace_scale, split_epsilon
from fedpriv.privacy.events import ComposedEvent, DpEvent, SelfComposedEvent

SUM_BOUND = 1e12
"""Clamping bound of a released sum (each record adds at most 1 + Σ r_j to it)."""


def _records(x: np.ndarray, box: Box) -> np.ndarray:
    x = np.asarray(x, float)
    if x.ndim != 2 or x.shape[1] != len(box.low):
        raise ValueError(f"records must have shape (n, {len(box.low)}), got {x.shape}")
    return box.clamp(x)


def assign(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of each record's nearest centroid."""
    return np.argmin(((x[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2), axis=1)


def cluster_sums(x: np.ndarray, centroids: np.ndarray, box: Box) -> np.ndarray:
    """Per cluster (count, Σ centred coordinates): shape (k, 1 + d). What a client sends."""
    x = _records(x, box)
    labels = assign(x, centroids)
    out = np.zeros((len(centroids), 1 + x.shape[1]))
    np.add.at(out, labels, np.hstack([np.ones((len(x), 1)), x - box.centre]))
    return out


def sums_sensitivity(box: Box) -> float:
    """L1 sensitivity of ``cluster_sums`` under add/remove: 1 + Σ_j r_j."""
    return 1.0 + float(box.radius.sum())


def update(noisy: np.ndarray, previous: np.ndarray, box: Box) -> np.ndarray:
    """New centroids from noisy (count, sum) rows; a count below 1 keeps the old centroid."""
    counts = noisy[:, 0]
    safe = counts >= 1.0
    means = np.where(safe[:, None], noisy[:, 1:] / np.where(safe, counts, 1.0)[:, None] + box.centre, previous)
    return box.clamp(means)


def moments(x: np.ndarray, box: Box) -> np.ndarray:
    """(count, Σ centred coordinates, Σ their squares): shape (1 + 2d,). What a client sends."""
    x = _records(x, box) - box.centre
    return np.concatenate([[len(x)], x.sum(axis=0), (x**2).sum(axis=0)])


def moments_sensitivity(box: Box) -> float:
    """L1 sensitivity of ``moments`` under add/remove: 1 + Σ_j r_j + Σ_j r_j²."""
    return 1.0 + float(box.radius.sum() + (box.radius**2).sum())


def noisy_moments(x: np.ndarray, box: Box, epsilon: float, rng: np.random.Generator | None = None) -> LaplaceRelease:
    """``moments`` with Laplace noise for ε: the release behind the initial centroids."""
    sensitivity = moments_sensitivity(box)
    return laplace_mechanism(moments(x, box), sensitivity=sensitivity, scale=_moments_scale(box, epsilon),
                             bounds=(-SUM_BOUND, SUM_BOUND), rng=rng)


def initial_centroids(noisy_moments: np.ndarray, k: int, box: Box, rng: np.random.Generator) -> np.ndarray:
    """k points from N(mean, diag(spread²)) of the noisy moments, clamped to the box (a
    noisy count below 1 gives the box's centre and its radius as the spread)."""
    d = len(box.low)
    count = noisy_moments[0]
    if count >= 1:
        mean = noisy_moments[1:1 + d] / count
        spread = np.sqrt(np.clip(noisy_moments[1 + d:] / count - mean**2, 0.0, box.radius**2))
    else:
        mean, spread = np.zeros(d), box.radius
    return box.clamp(box.centre + mean + spread * rng.standard_normal((k, d)))


def init_epsilon(epsilon: float, iterations: int) -> float:
    """Each release's share of ε: one of T + 1 equal ones whose exact sum is at most ε."""
    return split_epsilon(epsilon, (1.0,) * (iterations + 1))[0]


def dplloyd(x: np.ndarray, k: int, box: Box, epsilon: float, iterations: int = 3,
            rng: np.random.Generator | None = None, init_rng: np.random.Generator | None = None
            ) -> tuple[np.ndarray, DpEvent]:
    """ε-DP centroids: the noisy moments' initialisation, then ``iterations`` DPLloyd steps,
    each for ε/(T + 1); and their event. ``rng`` seeds the noise (``None``: the OS
    CSPRNG); ``init_rng`` the public draws of the initial centroids."""
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if k < 1 or iterations < 1:
        raise ValueError("k and iterations must be >= 1")
    x = _records(x, box)
    share = init_epsilon(epsilon, iterations)
    init = noisy_moments(x, box, share, rng)
    centroids = initial_centroids(init.values, k, box, init_rng or np.random.default_rng(0))
    event = None
    for _ in range(iterations):
        release = noisy_sums(x, centroids, box, share, rng)
        centroids, event = update(release.values, centroids, box), release.event
    if event is None:  # iterations >= 1 was checked above
        raise ValueError("k and iterations must be >= 1")
    return centroids, ComposedEvent((init.event, SelfComposedEvent(event, iterations)))


def release_event(k: int, box: Box, epsilon: float) -> DpEvent:
    """What one ``noisy_sums`` release costs, known before any data is touched."""
    return laplace_event(k * (1 + len(box.low)), sensitivity=sums_sensitivity(box), scale=_sums_scale(k, box, epsilon),
                         bounds=(-SUM_BOUND, SUM_BOUND))


def _sums_scale(k: int, box: Box, epsilon: float) -> float:
    """The Laplace scale of a ``noisy_sums`` release that spends at most ε (rounding included)."""
    return laplace_scale(k * (1 + len(box.low)), sensitivity=sums_sensitivity(box), epsilon=epsilon,
                         bounds=(-SUM_BOUND, SUM_BOUND))


def _moments_scale(box: Box, epsilon: float) -> float:
    """The Laplace scale of a ``noisy_moments`` release that spends at most ε (rounding included)."""
    return laplace_scale(1 + 2 * len(box.low), sensitivity=moments_sensitivity(box), epsilon=epsilon,
                         bounds=(-SUM_BOUND, SUM_BOUND))


def moments_event(box: Box, epsilon: float) -> DpEvent:
    """What one ``noisy_moments`` release costs, known before any data is touched."""
    return laplace_event(1 + 2 * len(box.low), sensitivity=moments_sensitivity(box), scale=_moments_scale(box, epsilon),
                         bounds=(-SUM_BOUND, SUM_BOUND))


def noisy_sums(x: np.ndarray, centroids: np.ndarray, box: Box, epsilon: float,
               rng: np.random.Generator | None = None) -> LaplaceRelease:
    """One DPLloyd release: ``cluster_sums`` with Laplace noise for ε (what a federated
    client sends each iteration)."""
    return laplace_mechanism(cluster_sums(x, centroids, box), sensitivity=sums_sensitivity(box),
                             scale=_sums_scale(len(centroids), box, epsilon), bounds=(-SUM_BOUND, SUM_BOUND), rng=rng)


def perturb_inputs(x: np.ndarray, box: Box, epsilon: float,
                   rng: np.random.Generator | None = None) -> tuple[np.ndarray, DpEvent]:
    """Each record plus Laplace noise for ε-local DP (L1 sensitivity Σ_j range_j); the
    event each record's owner spends."""
    x = _records(x, box)
    sensitivity = float((np.asarray(box.high, float) - np.asarray(box.low, float)).sum())
    bounds = (float(np.min(box.low)), float(np.max(box.high)))
    scale = laplace_scale(x.shape[1], sensitivity=sensitivity, epsilon=epsilon, bounds=bounds)
    noisy = np.empty_like(x)
    event = None
    for i, record in enumerate(x):
        release = laplace_mechanism(record, sensitivity=sensitivity, scale=scale, bounds=bounds, rng=rng)
        noisy[i], event = release.values, release.event
    if event is None:
        raise ValueError("perturb_inputs needs at least one record")
    return noisy, event


def clustering_accuracy(labels: np.ndarray, clusters: np.ndarray) -> float:
    """Accuracy of ``clusters`` against ``labels`` under the best one-to-one matching."""
    k = int(max(labels.max(), clusters.max())) + 1
    counts = np.zeros((k, k))
    np.add.at(counts, (clusters, labels), 1)
    rows, cols = linear_sum_assignment(-counts)
    return float(counts[rows, cols].sum() / len(labels))
