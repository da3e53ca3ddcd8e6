"""The mechanisms ``fedpriv.audit.mechanisms`` audits, one ``Case`` each (``CASES``): the
library's own mechanism run on two neighbouring inputs D and D′ chosen worst case (the
record that reaches the stated sensitivity), each output reduced to one number, the
log-likelihood ratio of D′ against D under the *claimed* noise, and the ε claimed for a
target ε.

``noise_factor`` < 1 runs the same code with that fraction of the noise while the claim
stays the one for full noise: the negative control.  Several mechanisms are run on n
stacked copies in one call (the same per-coordinate noise code, n times faster); the
others (k-means, output perturbation, DP-PCA, the evaluation) are called once per run.

Nothing here touches a node's state: the node's releases are drawn with the node's own
code (``fedpriv.federation.releases``, which ``clients.releases`` books) under a policy
whose state folder is a fresh temporary folder, checked to be still empty afterwards.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedpriv.privacy import ComposedEvent, GaussianEvent, LaplaceEvent, SelfComposedEvent, epsilon_of
from fedpriv.privacy.events import DistributedDiscreteGaussianEvent, DpEvent

DELTA = 1e-5

Sampler = Callable[[int, int, np.random.Generator, float, float], np.ndarray]
"""``sample(neighbour, n, rng, epsilon, noise_factor)``: n statistics from D (0) or D′ (1)."""


@dataclass(frozen=True)
class Case:
    """One mechanism's audit: its claimed ε for a target ε, its sampler, its δ, its default n."""

    description: str
    claimed: Callable[[float], float]
    sample: Sampler
    delta: float
    default_trials: int


def pure_epsilon(event: DpEvent) -> float:
    """Pure ε of a composition of Laplace events (basic composition: exact for pure DP)."""
    if isinstance(event, LaplaceEvent):
        return 1.0 / event.noise_multiplier
    if isinstance(event, ComposedEvent):
        return sum(pure_epsilon(e) for e in event.events)
    if isinstance(event, SelfComposedEvent):
        return event.count * pure_epsilon(event.event)
    raise ValueError(f"not a pure-DP event: {event!r}")


def _laplace_llr(outputs: np.ndarray, at_d: np.ndarray, at_d2: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """ln p_{D′}/p_D of Laplace outputs (rows), per-coordinate ``scales``."""
    return ((np.abs(outputs - at_d) - np.abs(outputs - at_d2)) / scales).sum(axis=-1)


# --- the Laplace primitive -------------------------------------------------------------------------------
def _laplace_claim(epsilon: float) -> float:
    from fedpriv.mechanisms import epsilon_of as laplace_epsilon

    return laplace_epsilon(1, 1.0, 1.0 / epsilon)


def _laplace(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    from fedpriv.mechanisms import laplace_mechanism

    release = laplace_mechanism(np.full(n, float(neighbour)), sensitivity=1.0, scale=factor / epsilon,
                                bounds=(0.0, 1.0), rng=rng)
    return release.values  # monotone in the likelihood ratio


# --- linear regression: the functional mechanism -----------------------------------------------------------
def _linreg_setup():  # noqa: ANN202
    from fedpriv.algorithms import linreg

    bounds = linreg.Bounds(low=np.array([-1.0]), high=np.array([1.0]), target=(-1.0, 1.0))
    # replace-one (the module's adjacency): (x, y) = (1, 1) against (0, −1) moves the
    # coefficients by 9 in L1 of the stated 16 (the largest: 8 + 8 would need x̃x̃ᵀ and yx̃ to flip together)
    d = linreg.coefficients(np.array([[1.0]]), np.array([1.0]), bounds)
    d2 = linreg.coefficients(np.array([[0.0]]), np.array([-1.0]), bounds)
    return linreg, d, d2


def _linreg_claim(epsilon: float) -> float:
    from fedpriv.algorithms import linreg

    return pure_epsilon(linreg.release_event(1, epsilon))


def _linreg(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    linreg, d, d2 = _linreg_setup()
    sums = d2 if neighbour else d
    stacked = linreg.Coefficients(np.tile(sums.quadratic, (n, 1)), np.tile(sums.linear, (n, 1)))
    noisy, _ = linreg.privatise(stacked, 1, epsilon / factor, rng=rng)
    s_quad, s_lin = linreg.sensitivities(1)  # noise scales s/(ε/2): privatise's default even split
    scales = np.concatenate([np.full(d.quadratic.size, 2 * s_quad), np.full(d.linear.size, 2 * s_lin)]) / epsilon
    return _laplace_llr(np.hstack([noisy.quadratic, noisy.linear]), np.concatenate([d.quadratic, d.linear]),
                        np.concatenate([d2.quadratic, d2.linear]), scales)


# --- k-means: DPLloyd's releases and input perturbation ----------------------------------------------------
def _box():  # noqa: ANN202
    from fedpriv.algorithms.box import Box

    return Box(np.zeros(2), np.ones(2))


CENTROIDS = np.array([[0.25, 0.25], [0.75, 0.75]])
CORNER = np.array([[1.0, 1.0]])
"""D = {} and D′ = {the box's corner}: one count and Σ_j r_j of one sum move, the stated 1 + Σ_j r_j."""


def _kmeans_claim(epsilon: float) -> float:
    from fedpriv.algorithms import kmeans

    return pure_epsilon(kmeans.release_event(len(CENTROIDS), _box(), epsilon))


def _kmeans(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    from fedpriv.algorithms import kmeans

    box = _box()
    records = [np.zeros((0, 2)), CORNER]
    at = [kmeans.cluster_sums(r, CENTROIDS, box).ravel() for r in records]
    outputs = np.array([kmeans.noisy_sums(records[neighbour], CENTROIDS, box, epsilon / factor, rng).values.ravel()
                        for _ in range(n)])
    return _laplace_llr(outputs, at[0], at[1], np.full(at[0].size, kmeans.sums_sensitivity(box) / epsilon))


def _moments_claim(epsilon: float) -> float:
    from fedpriv.algorithms import kmeans

    return pure_epsilon(kmeans.moments_event(_box(), epsilon))


def _moments(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    from fedpriv.algorithms import kmeans

    box = _box()
    records = [np.zeros((0, 2)), CORNER]
    at = [kmeans.moments(r, box) for r in records]
    outputs = np.array([kmeans.noisy_moments(records[neighbour], box, epsilon / factor, rng).values for _ in range(n)])
    return _laplace_llr(outputs, at[0], at[1], np.full(at[0].size, kmeans.moments_sensitivity(box) / epsilon))


def _perturb_claim(epsilon: float) -> float:
    from fedpriv.algorithms import kmeans

    _, event = kmeans.perturb_inputs(np.zeros((1, 2)), _box(), epsilon, np.random.default_rng(0))
    return pure_epsilon(event)


def _perturb(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    from fedpriv.algorithms import kmeans

    records = [np.zeros((1, 2)), np.ones((1, 2))]  # opposite corners: the stated Σ_j range_j
    noisy, _ = kmeans.perturb_inputs(np.repeat(records[neighbour], n, axis=0), _box(), epsilon / factor, rng)
    return _laplace_llr(noisy, records[0][0], records[1][0], np.full(2, 2.0 / epsilon))


# --- iris: output perturbation of a softmax ---------------------------------------------------------------
class _Answers(nn.Module):
    """A model whose softmax is (numerically) one vertex of the simplex whatever it is asked:
    two such models, trained on D and D′, sit the stated 2 apart in L1."""

    def __init__(self, vertex: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.nn.functional.one_hot(torch.tensor(vertex), 3).float() * 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(len(x), 3)


def _iris_claim(epsilon: float) -> float:
    from fedpriv.algorithms import iris

    return pure_epsilon(iris.answer_event(epsilon))


def _iris(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    from fedpriv.algorithms import iris

    answers, _ = iris.noisy_answers(_Answers(neighbour), np.zeros((n, iris.NUM_FEATURES)), epsilon / factor, rng)
    vertices = np.eye(3)
    return _laplace_llr(answers, vertices[0], vertices[1], np.full(3, iris.SENSITIVITY / epsilon))


# --- Gaussian releases: DP-PCA's covariance, a node's count of N and its evaluation ------------------------
def gaussian_noise_for(epsilon: float, delta: float = DELTA) -> float:
    """The smallest σ (to 1e-4, sensitivity 1) whose ``GaussianEvent`` costs ≤ ε at δ."""
    low, high = 1e-3, 1e3
    while high - low > 1e-4:
        mid = (low + high) / 2
        low, high = (low, mid) if epsilon_of(GaussianEvent(mid), delta) <= epsilon else (mid, high)
    return high


def _gaussian_claim(epsilon: float) -> float:
    return epsilon_of(GaussianEvent(gaussian_noise_for(epsilon)), DELTA)


def _count_claim(epsilon: float) -> float:
    """What the node books for its count: its policy's ``num_examples_event``."""
    return epsilon_of(_node_policy(Path("unused"), gaussian_noise_for(epsilon), None).num_examples_event(), DELTA)


def _dppca(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    from fedpriv.algorithms import dppca

    records = torch.eye(2)[1:] if neighbour == 0 else torch.eye(2)  # D′ adds e₁: entry (0, 0) moves by 1
    sigma = gaussian_noise_for(epsilon) * factor
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return np.array([float(dppca.noisy_second_moment(records, sigma, noise_generator=gen).matrix[0, 0])
                     for _ in range(n)])


SHARES, LATTICE_SENSITIVITY = 10, 4
"""The distributed noise's audit: 10 shares on a 1-D integer query of sensitivity 4 lattice units."""


def _shares_for(epsilon: float) -> float:
    """Each share's s: the 10 shares sum to the σ·Δ of a Gaussian costing ε."""
    return gaussian_noise_for(epsilon) * LATTICE_SENSITIVITY / math.sqrt(SHARES)


def _distributed_claim(epsilon: float) -> float:
    """What a node books for the unsampled release: the distributed discrete Gaussian event."""
    return epsilon_of(DistributedDiscreteGaussianEvent(_shares_for(epsilon), SHARES, LATTICE_SENSITIVITY, 1), DELTA)


def _distributed_noise(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    from fedpriv.distributed.noise import discrete_gaussian

    noise = np.sum([discrete_gaussian(_shares_for(epsilon) * factor, n, rng) for _ in range(SHARES)], axis=0)
    return neighbour * LATTICE_SENSITIVITY + noise  # the sum the server decodes: 0 vs Δ₂ plus the shares


def _node_policy(state_dir: Path, noise: float, rng: np.random.Generator | None) -> Any:
    """A throw-away seeded policy with both release noises at ``noise`` (its seed from ``rng``)."""
    from fedpriv.federation.policy import NodePolicy, Randomness

    return NodePolicy(epsilon_budget=1e9, state_dir=state_dir, randomness=Randomness.SEEDED,
                      seed=0 if rng is None else int(rng.integers(2**62)), num_examples_noise=noise,
                      evaluate_noise=noise)


def _on_own_copy(release: Callable[[Path], np.ndarray]) -> np.ndarray:
    """``release(state_dir)`` with a fresh, empty state folder that must stay empty."""
    with tempfile.TemporaryDirectory(prefix="fedpriv-audit-") as folder:
        values = release(Path(folder))
        if any(Path(folder).iterdir()):
            raise RuntimeError("a node release under audit wrote into its state folder")
    return values


NUM_EXAMPLES = 100


def _count(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    from fedpriv.federation.releases import node_noise, noisy_count

    def release(state_dir: Path) -> np.ndarray:
        policy = _node_policy(state_dir, gaussian_noise_for(epsilon) * factor, rng)
        noise = node_noise(policy, n, policy.num_examples_noise, "num-examples", "audit", 0).tolist()
        return np.array([noisy_count(NUM_EXAMPLES + neighbour, z) for z in noise], dtype=float)  # N vs N + 1

    return _on_own_copy(release)


class _Scored(nn.Module):
    """Logits NaN at the true class: the record counts as correct (NaN is argmax) with the
    clipped loss LOSS_CLIP (a non-finite loss is LOSS_CLIP): (1, 1, 1) in noise units, the stated √3."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(len(x), 10)
        logits[:, 0] = float("nan")
        return logits


def _evaluation_noise(epsilon: float) -> float:
    """The policy's ``evaluate_noise`` for ε: its event is GaussianEvent(evaluate_noise / √3)."""
    from fedpriv.federation.policy import EVALUATE_SENSITIVITY

    return gaussian_noise_for(epsilon) * EVALUATE_SENSITIVITY


def _evaluation_claim(epsilon: float) -> float:
    """What the node books for an evaluation: its policy's ``evaluate_event``."""
    return epsilon_of(_node_policy(Path("unused"), _evaluation_noise(epsilon), None).evaluate_event(), DELTA)


def _evaluation(neighbour: int, n: int, rng: np.random.Generator, epsilon: float, factor: float) -> np.ndarray:
    from fedpriv.federation.policy import LOSS_CLIP
    from fedpriv.federation.releases import noisy_evaluation

    def release(state_dir: Path) -> np.ndarray:
        policy = _node_policy(state_dir, _evaluation_noise(epsilon) * factor, rng)
        model = _Scored()
        features, labels = torch.zeros(neighbour, 1), torch.zeros(neighbour, dtype=torch.long)
        out = [noisy_evaluation(model, features, labels, policy, "audit", i) for i in range(n)]
        return np.array([o["count"] + o["correct"] + o["loss-sum"] / LOSS_CLIP for o in out])

    return _on_own_copy(release)


CASES: dict[str, Case] = {
    "laplace": Case("fedpriv.mechanisms.laplace_mechanism: one value, sensitivity 1, 0 vs 1",
                    _laplace_claim, _laplace, 0.0, 100_000),
    "linreg": Case("functional mechanism's noisy coefficients (1 feature), replace-one (1, 1) vs (0, −1)",
                   _linreg_claim, _linreg, 0.0, 200_000),
    "kmeans-dplloyd": Case("one DPLloyd release (k = 2 counts and sums in [0, 1]²), {} vs {corner}",
                           _kmeans_claim, _kmeans, 0.0, 20_000),
    "kmeans-init": Case("DPLloyd's initialisation (noisy moments in [0, 1]²), {} vs {corner}",
                        _moments_claim, _moments, 0.0, 20_000),
    "kmeans-input": Case("input perturbation of one record in [0, 1]², opposite corners",
                         _perturb_claim, _perturb, 0.0, 20_000),
    "iris-output": Case("output perturbation of a softmax answer, two vertices of the simplex",
                        _iris_claim, _iris, 0.0, 20_000),
    "dppca": Case("DP-PCA's noisy second moment (2 × 2), {e₂} vs {e₁, e₂}", _gaussian_claim, _dppca, DELTA, 100_000),
    "distributed-noise": Case("distributed mode's integer noise: 10 discrete Gaussian shares "
                              "(fedpriv.distributed.noise) on a 1-D integer query, 0 vs Δ₂ = 4",
                              _distributed_claim, _distributed_noise, DELTA, 100_000),
    "count": Case("a node's DP count of N (fedpriv.federation.releases.noisy_count), N vs N + 1",
                  _count_claim, _count, DELTA, 100_000),
    "evaluation": Case("a node's noisy evaluation (fedpriv.federation.releases), {} vs {a correct record at the "
                       "loss clip}",
                       _evaluation_claim, _evaluation, DELTA, 100_000),
}
"""Every mechanism that releases something, by the name the command takes."""
