"""Shared machinery of the (ε, δ)-composition accountants (``basic``, ``advanced``).

Every step is first made (ε_i, δ_i)-DP:
- Laplace b: ε₀ = 1/b, δ₀ = 0 (pure).
- Gaussian σ: given a per-step δ₀ = s, ε₀ is the exact analytic-Gaussian ε (Balle &
  Wang 2018, dp-accounting's ``get_epsilon_gaussian``), tighter than the classic
  σ = √(2 ln(1.25/δ))/ε, which is only valid for ε < 1.
- Poisson sampling at rate q (amplification, Li, Qardaji & Su 2012; Balle et al. 2018):
  ε_i = log(1 + q(e^ε₀ − 1)), δ_i = q·δ₀.
All Gaussian steps share the same s, so their δ's add up to W·s with W = Σ count·q.
The distributed discrete Gaussian has no (ε, δ) per-step form here: it is refused
(``UnsupportedEventError``); account for it with ``rdp`` (or ``zcdp``).
"""

from __future__ import annotations

import abc
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import dp_accounting
from scipy.optimize import brentq

from fedpriv.privacy._search import bisect
from fedpriv.privacy.accountants.base import Accountant, UnsupportedEventError
from fedpriv.privacy.accountants.steps import Step, flatten
from fedpriv.privacy.events import DpEvent, GaussianEvent, LaplaceEvent


def _gaussian_epsilon(m: GaussianEvent, step_delta: float) -> float:
    if m.noise_multiplier == 0:
        return math.inf
    return float(dp_accounting.get_epsilon_gaussian(m.noise_multiplier, step_delta))


def _laplace_epsilon(m: LaplaceEvent, step_delta: float) -> float:
    return math.inf if m.noise_multiplier == 0 else 1.0 / m.noise_multiplier


BASE_EPSILON: dict[type, Callable[[Any, float], float]] = {
    GaussianEvent: _gaussian_epsilon,
    LaplaceEvent: _laplace_epsilon,
}


def amplify(epsilon: float, sample_rate: float) -> float:
    """ε of an ε-DP mechanism run on a Poisson subsample: log(1 + q(e^ε − 1))."""
    return epsilon if sample_rate == 1 else math.log1p(sample_rate * math.expm1(epsilon))


class ApproxDpAccountant(Accountant[Counter[Step]]):
    """Keeps counted steps; subclasses define ε(δ); δ(ε) inverts it by bisection."""

    def __init__(self) -> None:
        self._steps: Counter[Step] = Counter()

    def _prepare(self, event: DpEvent) -> Counter[Step]:
        steps = flatten(event)
        for step in steps:
            if type(step.mechanism) not in BASE_EPSILON:
                raise UnsupportedEventError(f"{self.kind.value} accountant cannot account for {step.mechanism!r}: "
                                            "use rdp (or zcdp)")
        return steps

    def _apply(self, prepared: Counter[Step]) -> None:
        self._steps.update(prepared)

    @property
    def _delta_weight(self) -> float:
        """W = Σ count·q over Gaussian steps: their δ's total W·s."""
        return sum(n * s.sample_rate for s, n in self._steps.items() if isinstance(s.mechanism, GaussianEvent))

    def step_epsilons(self, step_delta: float) -> list[tuple[float, int]]:
        """[(ε_i, count_i)] with per-step Gaussian δ₀ = ``step_delta`` (capped at 1)."""
        s = min(step_delta, 1.0)
        return [
            (amplify(BASE_EPSILON[type(step.mechanism)](step.mechanism, s), step.sample_rate), n)
            for step, n in self._steps.items()
        ]

    def basic_epsilon(self, delta: float) -> float:
        """Σ count·ε_i with all of δ spread over the Gaussian steps (basic composition)."""
        weight = self._delta_weight
        return sum(n * e for e, n in self.step_epsilons(delta / weight if weight else 1.0))

    @abc.abstractmethod
    def _epsilon(self, delta: float) -> float: ...

    def _delta(self, epsilon: float) -> float:
        """Smallest δ on a log grid of relative width 1e-6 with ε(δ) <= ``epsilon``:
        Brent's method brackets the root of log δ ↦ ε(δ) − ε, bisection finishes it."""
        lo, hi = math.log(1e-300), math.log(1.0 - 1e-12)
        if not self._steps or self._epsilon(math.exp(lo)) <= epsilon:
            return 0.0
        if self._epsilon(math.exp(hi)) > epsilon:
            return 1.0

        def ok(log_d: float) -> bool:
            return self._epsilon(math.exp(log_d)) <= epsilon

        guess = brentq(lambda x: self._epsilon(math.exp(x)) - epsilon, lo, hi, xtol=1e-7)
        lo, hi = max(lo, guess - 1e-6), min(hi, guess + 1e-6)
        if ok(lo) or not ok(hi):
            lo, hi = math.log(1e-300), math.log(1.0 - 1e-12)
        _, hi = bisect(ok, lo, hi, done=lambda a, b: b - a < 1e-6)
        return math.exp(hi)
