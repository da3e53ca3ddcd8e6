"""Budget: an (ε, δ) privacy budget, the limit a ledger checks each record against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """An (ε, δ) privacy budget: 0 < ε (∞ allowed), 0 < δ < 1."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and self.epsilon > 0):
            raise ValueError(f"budget epsilon must be > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ValueError(f"budget delta must be in (0, 1), got {self.delta!r}")
