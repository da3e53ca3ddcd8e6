"""A box of per-coordinate ranges that the *user* states (never read off the data)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Box:
    """The user's stated range of every coordinate."""

    low: np.ndarray
    high: np.ndarray

    def __post_init__(self) -> None:
        low, high = np.asarray(self.low, float), np.asarray(self.high, float)
        if low.shape != high.shape or low.ndim != 1:
            raise ValueError("bounds must be two 1-d arrays of one length")
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low < high)):
            raise ValueError("bounds must be finite with low < high")

    @property
    def centre(self) -> np.ndarray:
        return (np.asarray(self.low, float) + np.asarray(self.high, float)) / 2

    @property
    def radius(self) -> np.ndarray:
        return (np.asarray(self.high, float) - np.asarray(self.low, float)) / 2

    def clamp(self, x: np.ndarray) -> np.ndarray:
        return np.clip(x, self.low, self.high)
