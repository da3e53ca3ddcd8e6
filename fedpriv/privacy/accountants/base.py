"""The accountant interface shared by every backend.

Invariants (checked by ``tests/privacy/test_accountant_contract.py`` for every backend):
- ``compose(event)`` validates the whole event first; an unsupported or malformed event
  raises ``UnsupportedEventError`` and leaves the accountant's state untouched.
- An empty accountant has ε = 0 for every δ and δ = 0 for every ε ≥ 0.
- ``epsilon(δ)`` is non-increasing in δ; ``delta(ε)`` is non-increasing in ε and is
  (up to numerical tolerance) its inverse: ``delta(epsilon(δ)) ≈ δ``.
- Every reported (ε, δ) is an upper bound: discretisation and grids only err upwards.
- Where every composed event is pure (unsampled Laplace), ε is at most their exact sum
  (basic composition, δ = 0: ``pure``), whichever backend: the tighter bound is reported.
"""

from __future__ import annotations

import abc
import enum
import math
from fractions import Fraction
from typing import Generic, TypeVar

from fedpriv.privacy.events import DpEvent


class UnsupportedEventError(ValueError):
    """The accountant cannot (soundly) account for this event; its state is unchanged."""


class AccountantKind(enum.StrEnum):
    """Which accountant to use; ``AccountantKind("rdp")`` accepts the plain strings."""

    RDP = "rdp"
    PLD = "pld"
    ZCDP = "zcdp"
    ADVANCED = "advanced"
    BASIC = "basic"

    @classmethod
    def _missing_(cls, value: object) -> AccountantKind:
        choices = ", ".join(k.value for k in cls)
        raise ValueError(f"unknown accountant {value!r}; choose one of: {choices}")


def check_delta(delta: float) -> float:
    """Return ``delta`` as a float if 0 < δ < 1, else raise ``ValueError`` naming it."""
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def check_epsilon(epsilon: float) -> float:
    """Return ``epsilon`` as a float if ε ≥ 0 (∞ allowed), else raise ``ValueError``."""
    if not (isinstance(epsilon, (int, float)) and epsilon >= 0 and not math.isnan(epsilon)):
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    return float(epsilon)


Prepared = TypeVar("Prepared")
"""What a backend computes from an event before it touches its state (an RDP curve, a ρ, ...)."""


class Accountant(abc.ABC, Generic[Prepared]):
    """Composes privacy events and converts the total into (ε, δ)-DP statements."""

    kind: AccountantKind
    _pure: Fraction | None = Fraction(0)
    """The exact basic-composition ε of everything composed while all of it is pure, else None."""

    def compose(self, event: DpEvent) -> Accountant[Prepared]:
        """Add ``event`` to the total; validate-then-mutate (see module docstring)."""
        from fedpriv.privacy.accountants.pure import pure_epsilon  # it builds on this module

        prepared = self._prepare(event)
        pure = None if self._pure is None else pure_epsilon(event)
        self._apply(prepared)
        self._pure = None if pure is None or self._pure is None else self._pure + pure
        return self

    @abc.abstractmethod
    def _prepare(self, event: DpEvent) -> Prepared:
        """Everything ``_apply`` needs, computed without touching state; raises
        ``UnsupportedEventError`` when the event cannot be accounted for."""

    @abc.abstractmethod
    def _apply(self, prepared: Prepared) -> None:
        """Mutate state with a validated event; must not raise."""

    def epsilon(self, delta: float) -> float:
        """Smallest ε this accountant can certify at ``delta`` (∞ if none): its own, or the
        pure events' exact sum where that is smaller."""
        from fedpriv.privacy.accountants.pure import round_up

        own = self._epsilon(check_delta(delta))
        return own if self._pure is None else min(own, round_up(self._pure))

    def delta(self, epsilon: float) -> float:
        """Smallest δ this accountant can certify at ``epsilon`` (1 if none): 0 where the
        pure events' exact sum is within ``epsilon``."""
        if self._pure is not None and self._pure <= Fraction(check_epsilon(epsilon)):
            return 0.0
        return self._delta(check_epsilon(epsilon))

    @abc.abstractmethod
    def _epsilon(self, delta: float) -> float: ...

    @abc.abstractmethod
    def _delta(self, epsilon: float) -> float: ...
