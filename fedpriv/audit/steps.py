"""White-box step audit of the DP-SGD engine: each step one sample of the Gaussian
mechanism it claims to be (Nasr et al. 2023, "Tight auditing of differentially private
machine learning"; the canary-aligned Gaussian statistics of Agrawal et al. 2026, "Let's
Ask Gauss").

Threat model: the auditor sees each step's noisy clipped sum (the privatised gradient times
the engine's public divisor: what a federated server sees of a node's step, and what the
adversary of centralized DP-SGD sees), and it inserts **gradient canaries** in steps it
chooses at random and knows. Step t calls the real engine (``train_dpsgd``, one step, on a
``CanaryModel``) on a lot the auditor composes: a random batch of real examples and canary j
iff the auditor's coin b_{t,j} (its own stream, probability ½) says so; the engine runs with
q = 1, so the lot is exactly that (Poisson sampling is the one-run audit's part). Canary j's
gradient has norm ``GAIN``·C on a coordinate nothing else touches, so an engine that clips at
C adds exactly C·e_j. The auditor reads, per step and canary, y = −(noisy sum)_j / C.

Under the claim (the Gaussian mechanism: sensitivity C, noise N(0, σ²C²) per coordinate)
the y are independent, y ~ N(b, σ²): the per-step Gaussian-DP parameter is μ = Δ/s with mean
shift Δ = 1 (in units of C) and noise s = σ, so μ_claimed = 1/σ. Two exact one-sided bounds,
each at α/2 (Bonferroni; they use disjoint observations):

- noise: over the n₀ observations with b = 0 (and the ``SENTINELS``), Σy²/s² ~ χ²(n₀), so
  s ≤ s⁺ = √(Σy² / χ²_{α/2}(n₀));
- clipping: over the n₁ observations with b = 1, Student's t gives Δ ≥ Δ⁻ = ȳ − t_{1−α/2}(n₁ − 1)·sd/√n₁.

So μ ≥ μ⁻ = Δ⁻/s⁺ with confidence 1 − α, and the audit **rejects the claim** when μ⁻ > 1/σ.
A noise bug (noise σC/2) shows as s⁺ ≈ σ/2, a clipping bug (canaries clipped to 2C) as
Δ⁻ ≈ 2: either way μ⁻ ≈ 2/σ. A correct engine is rejected with probability at most α; one
that adds more noise than claimed (more private) never more often.

Distributed mode (``clients`` K): step t is K nodes' real ``distributed_contribution`` (q = 1,
canary j a record of node j mod K; lattice, rounding, discrete Gaussian shares) summed mod
2^48 and decoded as the server decodes; the claim is the lattice's Δ₂ over the K shares'
noise σ·C·scale, μ = Δ₂/(σ·C·scale) (0.1 % above 1/σ: rounding's slack).

Assumptions: the noise is Gaussian (a sum of discrete Gaussians of large variance) and
independent across coordinates and steps (that is the claim tested), and a canary's Dirac
gradient is the worst case of the clipped sum's sensitivity (it reaches the bound; the test
is for the Gaussian mechanism of one step, not for Poisson sampling's amplification, which
the one-run audit exercises). ``epsilon_at_lower_bound`` is the ε the claim's accountant
gives the run (q, T steps) with steps of parameter μ⁻: above the claim exactly when the
claim is rejected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats

from fedpriv.audit.bugs import NO_BUG, EngineBug
from fedpriv.audit.canaries import CanaryModel, Recorder, observation, with_canaries
from fedpriv.distributed.contribution import decode_sum, distributed_contribution, unflatten
from fedpriv.distributed.lattice import Lattice, Rounding, fine_scale
from fedpriv.dpsgd import DPSGDConfig, train_dpsgd
from fedpriv.models import build_model
from fedpriv.privacy import distributed_dpsgd_event, dpsgd_event, epsilon_of
from fedpriv.seeding import derive_seed, generator

DEFAULT_ALPHA = 1e-4
"""The step audit's false-alarm rate: a correct engine is flagged at most this often."""

MIN_STEPS = 20
INSERTED_PER_SIGMA2 = 100
"""By default the audit takes enough steps for about 100·σ² observations with the canary:
the shift's bound then sits about 10 standard errors above 1.05 for a 2C bug and the noise's
well below σ for a σ/2 one, so either is missed with probability under 1e-6 at α = 1e-4
(measured: ``docs/audit.md``); the observations needed grow as σ², the noise per sample."""


@dataclass(frozen=True)
class StepAudit:
    """The white-box step audit's settings: ``canaries`` coordinates, ``steps`` engine steps,
    ``batch`` real examples per step; σ and C the claim's; q, T and δ only to state the
    ε the bound implies for the run (``epsilon_at_lower_bound``)."""

    noise_multiplier: float
    max_grad_norm: float = 1.0
    canaries: int = 64
    steps: int | None = None
    batch: int = 100
    alpha: float = DEFAULT_ALPHA
    seed: int = 0
    model: str = "cnn"
    lr: float = 0.05
    max_physical_batch_size: int = 256
    bug: EngineBug = NO_BUG
    clients: int | None = None
    """None: the engine's step (local mode); K: distributed mode's step over K nodes."""

    def __post_init__(self) -> None:
        if self.canaries < 2 or (self.steps is not None and self.steps < 1) or self.batch < 1:
            raise ValueError(f"need canaries >= 2, steps >= 1, batch >= 1, got {self.canaries}, {self.steps}, "
                             f"{self.batch}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"the claimed noise_multiplier must be finite and > 0, got {self.noise_multiplier!r}")


    @property
    def step_count(self) -> int:
        """``steps``, or by default enough for ``INSERTED_PER_SIGMA2``·σ² inserted observations."""
        if self.steps is not None:
            return self.steps
        return max(MIN_STEPS, math.ceil(2 * INSERTED_PER_SIGMA2 * self.noise_multiplier**2 / self.canaries))


@dataclass(frozen=True)
class Observations:
    """y per (step, canary) with the canary inserted (``inserted``) and not (``absent``, with
    the sentinels), in units of C."""

    inserted: np.ndarray
    absent: np.ndarray


class _EngineStep:
    """Local mode: one step of the real engine (``train_dpsgd``, q = 1) on the composed lot;
    the canary coordinates of its noisy clipped sum (the privatised gradient × the public
    divisor). The claim: sensitivity C, noise σC, so μ = 1/σ."""

    def __init__(self, setup: StepAudit, model: CanaryModel) -> None:
        self.setup, self.model = setup, model
        self.config = setup.bug.config(DPSGDConfig(noise_multiplier=setup.noise_multiplier,
                                                   max_grad_norm=setup.max_grad_norm, sample_rate=1.0,
                                                   max_physical_batch_size=setup.max_physical_batch_size))
        self.divisor = setup.batch + setup.canaries / 2  # public: the same whatever the coins
        self.mu_claimed = 1 / setup.noise_multiplier

    def __call__(self, x: torch.Tensor, y: torch.Tensor, chosen: torch.Tensor, t: int) -> torch.Tensor:
        recorder = Recorder(self.model, self.setup.lr)
        seed = self.setup.seed
        train_dpsgd(self.model, x, y, config=self.config, steps=1, optimizer=recorder,
                    sampling_generator=generator(seed, "audit", "step-lot", t),
                    noise_generator=generator(seed, "audit", "step-noise", t), expected_lot_size=self.divisor)
        return recorder.seen[0] * self.divisor

    def epsilon_at(self, mu: float, sample_rate: float, steps: int, delta: float) -> float:
        """The run's ε by the claim's accountant were every step a Gaussian of multiplier 1/μ."""
        return epsilon_of(dpsgd_event(1 / mu, sample_rate, steps), delta)


class _DistributedStep:
    """Distributed mode: K nodes' ``distributed_contribution`` (q = 1: each node's part of
    the composed lot, canary j a record of node j mod K; nearest rounding onto the lattice,
    its discrete Gaussian share for K honest shares) summed mod 2^48 and decoded as the
    server decodes; the canary coordinates of that sum, and the server's step. The claim:
    the lattice's Δ₂ over the K shares' noise σ·C·scale."""

    def __init__(self, setup: StepAudit, model: CanaryModel, clients: int) -> None:
        self.setup, self.model, self.clients = setup, model, clients
        dimension = sum(p.numel() for p in model.parameters())
        self.lattice = canary_lattice(setup.max_grad_norm, dimension)
        self.mu_claimed = self.lattice.sensitivity / (setup.noise_multiplier * self.lattice.clip)
        self.divisor = setup.batch + setup.canaries / 2

    def __call__(self, x: torch.Tensor, y: torch.Tensor, chosen: torch.Tensor, t: int) -> torch.Tensor:
        seed, lattice, clients = self.setup.seed, self.lattice, self.clients
        node = torch.cat([torch.arange(self.setup.batch) % clients, chosen % clients])
        total = np.zeros(lattice.dimension, dtype=np.uint64)
        for k in range(clients):
            mine = node == k
            contribution = distributed_contribution(
                self.model, x[mine], y[mine], sample_rate=1.0, lattice=lattice,
                noise_multiplier=self.setup.noise_multiplier * self.setup.bug.noise_scale, honest_shares=clients,
                secure=False, max_physical_batch_size=self.setup.max_physical_batch_size,
                sampling_generator=generator(seed, "audit", "step-lot", k, t),
                rounding_generator=generator(seed, "audit", "step-rounding", k, t),
                noise_generator=np.random.default_rng(derive_seed(seed, "audit", "step-noise", k, t)))
            total = (total + contribution.vector) % np.uint64(lattice.modulus)
        grads = unflatten(decode_sum(total, lattice), self.model)  # the noisy clipped sum the server sees
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.sub_(self.setup.lr / self.divisor * grads[name])
        return grads["canary.weight"][0].clone()

    def epsilon_at(self, mu: float, sample_rate: float, steps: int, delta: float) -> float:
        """The run's ε by the distributed event were the K shares' noise Δ₂/μ in all."""
        share = self.lattice.sensitivity / (mu * math.sqrt(self.clients))
        return epsilon_of(distributed_dpsgd_event(share, self.clients, self.lattice.sensitivity,
                                                  self.lattice.dimension, sample_rate, steps), delta)


def canary_lattice(max_grad_norm: float, dimension: int) -> Lattice:
    """The audits' lattice for distributed mode: nearest rounding at the scale that keeps Δ₂
    within 0.1 % of C, a 48-bit secure sum."""
    return Lattice(fine_scale(max_grad_norm, dimension, rounding=Rounding.NEAREST), max_grad_norm, dimension,
                   modulus_bits=48, rounding=Rounding.NEAREST)


def observe(setup: StepAudit, features: torch.Tensor, labels: torch.Tensor,
            progress: Callable[[str], None] | None = None) -> tuple[Observations, _EngineStep | _DistributedStep]:
    """Run ``setup.step_count`` steps with canaries in the auditor's chosen steps; the y's
    and the step that made them (its claim)."""
    coins = torch.rand(setup.step_count, setup.canaries, generator=generator(setup.seed, "audit", "step-coins")) < 0.5
    pick = generator(setup.seed, "audit", "step-batches")
    model = CanaryModel(build_model(setup.model, setup.seed), tuple(features.shape[1:]), setup.canaries, 10,
                        setup.max_grad_norm)
    step = _EngineStep(setup, model) if setup.clients is None else _DistributedStep(setup, model, setup.clients)
    seen = []
    for t in range(setup.step_count):
        real = torch.randperm(len(labels), generator=pick)[:setup.batch]
        x, y, chosen = with_canaries(features[real], labels[real], coins[t])
        seen.append(step(x, y, chosen, t))
        if progress is not None:
            progress(f"white-box step audit: step {t + 1}/{setup.step_count}")
    counts = observation(torch.stack(seen), 1.0, setup.max_grad_norm).double().numpy()  # (T, m + sentinels)
    canary = counts[:, :setup.canaries]
    inserted = coins.numpy()
    return Observations(canary[inserted], np.concatenate([canary[~inserted], counts[:, setup.canaries:].ravel()])), step


@dataclass(frozen=True)
class StepBound:
    """The test's numbers, in units of C (noise) and of C (shift)."""

    noise_estimate: float
    noise_upper: float
    shift_estimate: float
    shift_lower: float
    mu_claimed: float
    mu_estimate: float
    mu_lower: float
    inserted: int
    absent: int
    alpha: float

    @property
    def flagged(self) -> bool:
        return self.mu_lower > self.mu_claimed


def bound(seen: Observations, mu_claimed: float, alpha: float) -> StepBound:
    """The one-sided bounds of the module docstring, each at ``alpha``/2, and μ⁻ = Δ⁻/s⁺."""
    absent, inserted = seen.absent, seen.inserted
    if len(absent) < 1 or len(inserted) < 2:
        raise ValueError("the step audit needs observations with and without the canary: more steps or canaries")
    squares = float(np.sum(absent**2))
    noise_upper = math.sqrt(squares / stats.chi2.ppf(alpha / 2, len(absent)))
    mean, sd = float(inserted.mean()), float(inserted.std(ddof=1))
    shift_lower = mean - float(stats.t.ppf(1 - alpha / 2, len(inserted) - 1)) * sd / math.sqrt(len(inserted))
    noise_estimate = math.sqrt(squares / len(absent))
    mu_lower = math.inf if noise_upper == 0 else max(0.0, shift_lower) / noise_upper
    mu_estimate = math.inf if noise_estimate == 0 else mean / noise_estimate
    return StepBound(noise_estimate, noise_upper, mean, shift_lower, mu_claimed, mu_estimate, mu_lower,
                     len(inserted), len(absent), alpha)


def audit_steps(setup: StepAudit, features: torch.Tensor, labels: torch.Tensor, sample_rate: float, run_steps: int,
                delta: float, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the white-box step audit; its part of the command's result."""
    seen, step = observe(setup, features, labels, progress)
    result = bound(seen, step.mu_claimed, setup.alpha)
    implied = math.inf if result.mu_lower == math.inf else \
        0.0 if result.mu_lower == 0 else step.epsilon_at(result.mu_lower, sample_rate, run_steps, delta)
    return {
        "method": "white-box step audit (Nasr et al. 2023): Dirac gradient canaries inserted in known random steps "
                  "of the real engine; chi-square bound on the noise, Student t bound on the clipped canary's shift",
        "confidence": 1 - setup.alpha,
        "flagged": result.flagged,
        "mu_claimed": result.mu_claimed,
        "mu_estimate": _finite(result.mu_estimate),
        "mu_lower_bound": _finite(result.mu_lower),
        "epsilon_at_lower_bound": _finite(implied),
        "noise_multiplier_claimed": setup.noise_multiplier,
        "noise_multiplier_estimate": result.noise_estimate,
        "noise_multiplier_upper_bound": result.noise_upper,
        "clipped_norm_estimate": result.shift_estimate * setup.max_grad_norm,
        "clipped_norm_lower_bound": result.shift_lower * setup.max_grad_norm,
        "max_grad_norm_claimed": setup.max_grad_norm,
        "observations": {"inserted": result.inserted, "absent": result.absent},
        "canaries": setup.canaries,
        "steps": setup.step_count,
        "batch": setup.batch,
        "assumptions": "each step is claimed to be a Gaussian mechanism of sensitivity C and noise σC, independent "
                       "across coordinates and steps; a Dirac canary reaches the sensitivity; Poisson sampling is "
                       "not tested here (the one-run part runs it)",
    }


def _finite(value: float) -> float | None:
    """``value``, or None for ∞ (no noise at all: JSON has no infinity)."""
    return None if math.isinf(value) else value
