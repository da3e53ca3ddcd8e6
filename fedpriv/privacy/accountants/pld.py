"""Privacy loss distributions via dp-accounting's ``PLDAccountant``.

The PLD of each mechanism is discretised on a grid of privacy-loss values of width
``VALUE_DISCRETIZATION_INTERVAL`` with pessimistic rounding (so the result is an upper
bound) and composed by FFT; ε(δ) and δ(ε) are read off the composed distribution — the
tightest of the accountants here. Supports Gaussian, Laplace and Poisson-sampled
Gaussian or Laplace.

``VALUE_DISCRETIZATION_INTERVAL = 1e-4``: for Abadi et al.'s example (q = 0.01, σ = 4,
T = 10,000, δ = 1e-5) it gives ε = 0.947 in ~0.1 s; 1e-3 gives 0.960 in ~0.04 s and
1e-2 gives 1.76 (too coarse).
"""

from __future__ import annotations

from dp_accounting.pld import PLDAccountant as _DpaPldAccountant

from fedpriv.privacy.accountants.base import AccountantKind
from fedpriv.privacy.accountants.wrapped import DpAccountingAccountant

VALUE_DISCRETIZATION_INTERVAL = 1e-4


class PldAccountant(DpAccountingAccountant):
    """Privacy-loss-distribution accountant."""

    kind = AccountantKind.PLD

    def __init__(self, value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL) -> None:
        super().__init__(_DpaPldAccountant(value_discretization_interval=value_discretization_interval))
