"""Advanced composition (Dwork, Rothblum & Vadhan 2010; Dwork & Roth 2014, Thm 3.20).

k adaptive (ε, δ)-DP steps are (ε_tot, kδ + δ')-DP for every δ' > 0, with
ε_tot = √(2k ln(1/δ'))·ε + k·ε(e^ε − 1). For heterogeneous steps the same martingale
argument gives ε_tot = √(2 ln(1/δ') Σε_i²) + Σ ε_i(e^{ε_i} − 1) (Kairouz et al. 2015),
which is what is computed (it equals Thm 3.20 when all steps agree).

Per-step (ε_i, δ_i) come from ``approx`` (analytic Gaussian, then amplification
log(1 + q(e^ε − 1)), q·δ). ``epsilon(δ)`` minimises over the split δ = δ' + W·s
(bounded Brent search on logit(δ'/δ)) and returns the smaller of that and basic
composition — both are valid bounds, so any split is sound.
"""

from __future__ import annotations

import math

from scipy.optimize import minimize_scalar
from scipy.special import expit

from fedpriv.privacy.accountants.approx import ApproxDpAccountant
from fedpriv.privacy.accountants.base import AccountantKind


class AdvancedAccountant(ApproxDpAccountant):
    """Advanced composition with an optimised δ split."""

    kind = AccountantKind.ADVANCED

    def advanced_epsilon(self, delta_prime: float, step_delta: float) -> float:
        """ε_tot for a given δ' and per-step Gaussian δ₀."""
        steps = self.step_epsilons(step_delta)
        if any(math.isinf(e) for e, _ in steps):
            return math.inf
        squares = sum(n * e * e for e, n in steps)
        drift = sum(n * e * math.expm1(e) for e, n in steps)
        return math.sqrt(2.0 * math.log(1.0 / delta_prime) * squares) + drift

    def _epsilon(self, delta: float) -> float:
        if not self._steps:
            return 0.0
        weight = self._delta_weight
        if weight == 0:
            return min(self.basic_epsilon(delta), self.advanced_epsilon(delta, 1.0))

        def split(t: float) -> float:
            u = float(expit(t))
            return self.advanced_epsilon(u * delta, (1.0 - u) * delta / weight)

        best = minimize_scalar(split, bounds=(-30.0, 30.0), method="bounded", options={"xatol": 1e-4})
        return min(self.basic_epsilon(delta), float(best.fun))
