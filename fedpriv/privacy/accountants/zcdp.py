"""Zero-concentrated DP (Bun & Steinke 2016).

Per step: Gaussian σ is ρ = Δ²/(2τ) = 1/(2σ²)-zCDP (Prop 1.6); Laplace (pure ε = 1/b)
is ρ = ε²/2 (Prop 1.4); the distributed discrete Gaussian is ρ = (S + √d·τ)²/2-zCDP
(Kairouz, Liu & Steinke 2021, ``distributed.rho``). Composition adds ρ (Lemma 1.7).
Conversion (Prop 1.3): ε(δ) = ρ + 2√(ρ log(1/δ)), inverted exactly by
δ(ε) = exp(−(ε − ρ)²/(4ρ)) for ε > ρ.

Soundness — Poisson subsampling gets **no amplification**: a sampled step is charged
the ρ of the unsampled mechanism. That is a valid upper bound (the subsample of
neighbouring data sets are equal or neighbouring, and Rényi divergence is jointly
quasi-convex), but loose. zCDP does not amplify under subsampling in general; the
DP-dropout paper's shortcut (amplify an (ε, δ)-DP step, then treat it as zCDP) is not a
valid bound and is only reproduced, labelled, in ``fedpriv.privacy.dpdropout``. Use
``rdp`` or ``pld`` for subsampled DP-SGD.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from fedpriv.privacy.accountants.base import Accountant, AccountantKind
from fedpriv.privacy.accountants.distributed import rho as _distributed_rho
from fedpriv.privacy.accountants.steps import Step, flatten
from fedpriv.privacy.events import DistributedDiscreteGaussianEvent, DpEvent, GaussianEvent, LaplaceEvent


def _gaussian_rho(m: GaussianEvent) -> float:
    return math.inf if m.noise_multiplier == 0 else 1.0 / (2.0 * m.noise_multiplier**2)


def _laplace_rho(m: LaplaceEvent) -> float:
    return math.inf if m.noise_multiplier == 0 else 0.5 / m.noise_multiplier**2


RHO: dict[type, Callable[[Any], float]] = {
    GaussianEvent: _gaussian_rho,
    LaplaceEvent: _laplace_rho,
    DistributedDiscreteGaussianEvent: _distributed_rho,
}


def rho_of(steps: Counter[Step]) -> float:
    """Total ρ of counted steps (sampling ignored: no amplification, see module doc)."""
    return sum((n * RHO[type(s.mechanism)](s.mechanism) for s, n in steps.items()), 0.0)


def zcdp_epsilon(rho: float, delta: float) -> float:
    """ε = ρ + 2√(ρ log(1/δ)) (Bun & Steinke Prop 1.3)."""
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


class ZcdpAccountant(Accountant[float]):
    """zCDP accountant; state is the total ρ."""

    kind = AccountantKind.ZCDP

    def __init__(self) -> None:
        self.rho = 0.0

    def _prepare(self, event: DpEvent) -> float:
        return rho_of(flatten(event))

    def _apply(self, prepared: float) -> None:
        self.rho += prepared

    def _epsilon(self, delta: float) -> float:
        return zcdp_epsilon(self.rho, delta)

    def _delta(self, epsilon: float) -> float:
        if self.rho == 0:
            return 0.0
        if epsilon <= self.rho:
            return 1.0
        return min(1.0, math.exp(-((epsilon - self.rho) ** 2) / (4.0 * self.rho)))
