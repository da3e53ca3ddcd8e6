"""Basic composition: k steps that are (ε_i, δ_i)-DP are (Σε_i, Σδ_i)-DP.

Per-step (ε_i, δ_i) as in ``approx`` (analytic Gaussian, amplification by sampling);
``epsilon(δ)`` spreads all of δ evenly over the Gaussian steps. Loose; a baseline.
"""

from __future__ import annotations

from fedpriv.privacy.accountants.approx import ApproxDpAccountant
from fedpriv.privacy.accountants.base import AccountantKind


class BasicAccountant(ApproxDpAccountant):
    """Sums ε and δ."""

    kind = AccountantKind.BASIC

    def _epsilon(self, delta: float) -> float:
        return self.basic_epsilon(delta)
