"""Rényi DP (moments accountant) via dp-accounting's ``RdpAccountant``.

Each event adds its RDP curve ε_α at every order α of ``ORDERS``; the total converts to
(ε, δ)-DP with dp-accounting's conversion (Canonne–Kamath–Steinke / Balle et al. 2020),
minimised over the grid. For the unsampled Gaussian ε_α = α/(2σ²) exactly; the
Poisson-subsampled Gaussian uses Mironov, Talwar & Zhang (2019). Supports Gaussian,
Laplace (unsampled) and Poisson-sampled (compositions of) Gaussians.

``ORDERS`` (153 orders, 1.01 … 512): fine fractional orders where DP-SGD optima lie
(1.01–1.09 by 0.01, 1.1–10.9 by 0.1), every integer 11–32, even integers to 64, then a
sparse tail to 512. dp-accounting evaluates integer order α in O(α) Python steps, so a
tail to 10,000 would cost ~0.3 s per subsampled Gaussian (measured) against ~40 ms for
this grid; orders > 512 only win for ε below ~0.01, where a coarser bound is harmless.
A grid only ever makes ε larger (each order gives a valid bound), never unsound.
"""

from __future__ import annotations

import numpy as np
from dp_accounting.rdp import RdpAccountant as _DpaRdpAccountant

from fedpriv.privacy.accountants.base import AccountantKind
from fedpriv.privacy.accountants.wrapped import DpAccountingAccountant

ORDERS: tuple[float, ...] = tuple(
    float(x)
    for x in np.unique(
        np.concatenate(
            [
                np.round(np.arange(1.01, 1.095, 0.01), 2),
                np.round(np.arange(1.1, 10.95, 0.1), 1),
                np.arange(11, 33),
                np.arange(34, 65, 2),
                [80, 96, 128, 192, 256, 384, 512],
            ]
        )
    )
)


class RdpAccountant(DpAccountingAccountant):
    """Rényi-DP accountant on the ``ORDERS`` grid."""

    kind = AccountantKind.RDP

    def __init__(self, orders: tuple[float, ...] = ORDERS) -> None:
        super().__init__(_DpaRdpAccountant(orders=list(orders)))

    @property
    def orders(self) -> np.ndarray:
        """The RDP orders α."""
        return self._backend.orders

    @property
    def rdp(self) -> np.ndarray:
        """Total RDP ε_α at each order (a copy)."""
        return self._backend.rdp
