"""Rényi DP (moments accountant) via dp-accounting's ``RdpAccountant``.

Each event adds its RDP curve ε_α at every order α of ``ORDERS``; the total converts to
(ε, δ)-DP with dp-accounting's conversion (Canonne–Kamath–Steinke / Balle et al. 2020),
minimised over the grid. For the unsampled Gaussian ε_α = α/(2σ²) exactly; the
Poisson-subsampled Gaussian uses Mironov, Talwar & Zhang (2019). Supports Gaussian,
Laplace (unsampled), Poisson-sampled Gaussians, and the (Poisson-sampled) distributed
discrete Gaussian, whose curve fedpriv computes itself (``distributed``: Kairouz et al.'s
bound, Zhu & Wang's general subsampling bound).

``ORDERS`` (153 orders, 1.01 … 512): fine fractional orders where DP-SGD optima lie
(1.01–1.09 by 0.01, 1.1–10.9 by 0.1), every integer 11–32, even integers to 64, then a
sparse tail to 512. dp-accounting evaluates integer order α in O(α) Python steps, so a
tail to 10,000 would cost ~0.3 s per subsampled Gaussian (measured) against ~40 ms for
this grid; orders > 512 only win for ε below ~0.01, where a coarser bound is harmless.
A grid only ever makes ε larger (each order gives a valid bound), never unsound.

Speed: the accountant flattens events into counted steps (``steps.flatten``) and keeps
the total RDP vector itself; each distinct step's curve is computed once by
dp-accounting and cached, so a ledger re-checking many clients with the same (σ, q)
pays for the curve once and only for the conversion afterwards. Counts multiply the
curve, so R rounds of s steps give exactly the RDP of one R·s-step event.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import numpy as np
from dp_accounting.rdp import RdpAccountant as _DpaRdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_delta, compute_epsilon

from fedpriv.privacy.accountants.base import Accountant, AccountantKind, UnsupportedEventError
from fedpriv.privacy.accountants.distributed import distributed_rdp
from fedpriv.privacy.accountants.steps import Step, flatten
from fedpriv.privacy.events import DistributedDiscreteGaussianEvent, DpEvent, PoissonSampledEvent, to_dp_accounting

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


@contextmanager
def _quiet_absl() -> Iterator[None]:
    """Silence dp-accounting's "failed to converge ... Excluding this order" warnings:
    an excluded order is +inf on the grid, which can only make ε larger (sound), and
    calibration's search would otherwise print dozens of them."""
    logger = logging.getLogger("absl")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


@lru_cache(maxsize=4096)
def step_rdp(step: Step, orders: tuple[float, ...] = ORDERS) -> np.ndarray:
    """RDP curve (ε_α at each order) of one step, by dp-accounting (the distributed discrete
    Gaussian by ``distributed``); read-only, cached."""
    if isinstance(step.mechanism, DistributedDiscreteGaussianEvent):
        curve = distributed_rdp(step.mechanism, step.sample_rate, np.array(orders, dtype=float))
        curve.setflags(write=False)
        return curve
    event = step.mechanism if step.sample_rate == 1 else PoissonSampledEvent(step.sample_rate, step.mechanism)
    backend = _DpaRdpAccountant(orders=list(orders))
    translated = to_dp_accounting(event)
    if not backend.supports(translated):
        raise UnsupportedEventError(f"rdp accountant does not support {event!r}")
    with _quiet_absl():
        backend.compose(translated)
    curve = np.array(backend.rdp, dtype=float)
    curve.setflags(write=False)
    return curve


class RdpAccountant(Accountant[np.ndarray]):
    """Rényi-DP accountant on the ``ORDERS`` grid; state is the total RDP vector."""

    kind = AccountantKind.RDP

    def __init__(self, orders: tuple[float, ...] = ORDERS) -> None:
        self._orders = tuple(float(a) for a in orders)
        self._rdp = np.zeros(len(self._orders))

    def _prepare(self, event: DpEvent) -> np.ndarray:
        steps: Counter[Step] = flatten(event)
        total = np.zeros(len(self._orders))
        for step, count in steps.items():
            total = total + count * step_rdp(step, self._orders)
        return total

    def _apply(self, prepared: np.ndarray) -> None:
        self._rdp = self._rdp + prepared

    def _epsilon(self, delta: float) -> float:
        if not self._rdp.any():
            return 0.0
        return float(compute_epsilon(self._orders, self._rdp, delta)[0])

    def _delta(self, epsilon: float) -> float:
        if not self._rdp.any():
            return 0.0
        return float(compute_delta(self._orders, self._rdp, epsilon)[0])

    @property
    def orders(self) -> np.ndarray:
        """The RDP orders α."""
        return np.array(self._orders)

    @property
    def rdp(self) -> np.ndarray:
        """Total RDP ε_α at each order (a copy)."""
        return self._rdp.copy()
