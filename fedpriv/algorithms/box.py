"""A box of per-coordinate ranges that the *user* states (never read off the data), and the
one rule that brings any record into it.

``clamp`` maps every coordinate into its range, NaN and ±∞ included (±∞ to the nearer bound,
NaN to the midpoint): a fixed map of each record on its own, so a record with a NaN changes a
release no more than any other record can, and no release fails on one (a failure would be
an unbooked, data-dependent bit).
"""

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
        return clamp(x, self.low, self.high)


def clamp(x: np.typing.ArrayLike, low: np.typing.ArrayLike, high: np.typing.ArrayLike) -> np.ndarray:
    """``x`` clipped to [low, high] per coordinate, ±∞ to the bound, NaN to (low + high)/2."""
    low, high = np.asarray(low, float), np.asarray(high, float)
    x = np.asarray(x, float)
    return np.clip(np.where(np.isnan(x), (low + high) / 2, x), low, high)
