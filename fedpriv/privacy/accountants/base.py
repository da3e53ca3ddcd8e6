"""The accountant interface shared by every backend.

Invariants (checked by ``tests/privacy/test_accountant_contract.py`` for every backend):
- ``compose(event)`` validates the whole event first; an unsupported or malformed event
  raises ``UnsupportedEventError`` and leaves the accountant's state untouched.
- An empty accountant has ε = 0 for every δ and δ = 0 for every ε ≥ 0.
- ``epsilon(δ)`` is non-increasing in δ; ``delta(ε)`` is non-increasing in ε and is
  (up to numerical tolerance) its inverse: ``delta(epsilon(δ)) ≈ δ``.
- Every reported (ε, δ) is an upper bound: discretisation and grids only err upwards.
"""

from __future__ import annotations

import abc
import enum
import math
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

    def compose(self, event: DpEvent) -> Accountant[Prepared]:
        """Add ``event`` to the total; validate-then-mutate (see module docstring)."""
        self._apply(self._prepare(event))
        return self

    @abc.abstractmethod
    def _prepare(self, event: DpEvent) -> Prepared:
        """Everything ``_apply`` needs, computed without touching state; raises
        ``UnsupportedEventError`` when the event cannot be accounted for."""

    @abc.abstractmethod
    def _apply(self, prepared: Prepared) -> None:
        """Mutate state with a validated event; must not raise."""

    def epsilon(self, delta: float) -> float:
        """Smallest ε this accountant can certify at ``delta`` (∞ if none)."""
        return self._epsilon(check_delta(delta))

    def delta(self, epsilon: float) -> float:
        """Smallest δ this accountant can certify at ``epsilon`` (1 if none)."""
        return self._delta(check_epsilon(epsilon))

    @abc.abstractmethod
    def _epsilon(self, delta: float) -> float: ...

    @abc.abstractmethod
    def _delta(self, epsilon: float) -> float: ...
