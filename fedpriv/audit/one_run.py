"""The one-run ε lower bound of Steinke, Nasr & Jagielski ("Privacy Auditing with One (1)
Training Run", NeurIPS 2023).

m canaries, each included by a fair coin the auditor keeps; after one run the auditor
guesses "in" for the k₊ highest scores, "out" for the k₋ lowest, and abstains on the rest.
Under (ε, δ)-DP the number W of correct guesses among r = k₊ + k₋ satisfies (their
Theorem 5.2), for every v,

    P[W ≥ v] ≤ f(v) + 2mδ · max_{1 ≤ i ≤ v} (f(v − i) − f(v)) / i,
    f(v) = P[Binomial(r, e^ε / (1 + e^ε)) ≥ v].

The lower bound is the largest ε whose bound on P[W ≥ v] at the observed v is still
≤ 1 − confidence: every smaller ε is rejected at that confidence.  The bound is increasing
in ε, so a bisection finds it.  Trying several (k₊, k₋) pairs and keeping the best is a
multiple test: ``best_guesses`` runs each at (1 − confidence)/pairs (Bonferroni), so the
reported bound keeps its confidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

DEFAULT_CONFIDENCE = 0.95


def p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """The theorem's bound on P[W ≥ ``correct``] for an (ε, δ)-DP run (at most 1)."""
    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got {correct}, {guesses}, {canaries}")
    if correct == 0:
        return 1.0
    p = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of ε-DP randomised response
    tail = float(stats.binom.sf(correct - 1, guesses, p))  # f(v)
    if delta == 0:
        return min(1.0, tail)
    # f(v − i) − f(v) = P[v − i ≤ Bin < v] for i = 1..v: cumulative sums of the pmf below v
    below = stats.binom.pmf(np.arange(correct - 1, -1, -1), guesses, p)
    gaps = np.cumsum(below) / np.arange(1, correct + 1)
    return min(1.0, tail + 2 * canaries * delta * float(gaps.max()))


def epsilon_lower_bound(canaries: int, guesses: int, correct: int, delta: float,
                        confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The largest ε (to 1e-6) with ``p_value`` ≤ 1 − ``confidence``; 0 when none is rejected."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    alpha = 1 - confidence
    if p_value(canaries, guesses, correct, 0.0, delta) > alpha:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(canaries, guesses, correct, high, delta) <= alpha:
        low, high = high, 2 * high  # ends: as ε grows f(v) → 1 > 1 − confidence
    while high - low > 1e-6:
        mid = (low + high) / 2
        low, high = (mid, high) if p_value(canaries, guesses, correct, mid, delta) <= alpha else (low, mid)
    return low


@dataclass(frozen=True)
class Guesses:
    """One (k₊, k₋) choice: how many guesses were made and how many were right."""

    k_in: int
    k_out: int
    correct: int

    @property
    def guesses(self) -> int:
        return self.k_in + self.k_out


def score_guesses(scores: np.ndarray, included: np.ndarray, k_in: int, k_out: int) -> Guesses:
    """Guess "in" for the ``k_in`` highest ``scores``, "out" for the ``k_out`` lowest (ties
    broken by index, never by the coins), and count the right ones against ``included``."""
    scores, included = np.asarray(scores, float), np.asarray(included, bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError("scores and coins must be two 1-d arrays of one length")
    if k_in < 0 or k_out < 0 or k_in + k_out > len(scores):
        raise ValueError(f"need k_in, k_out >= 0 with k_in + k_out <= {len(scores)}, got {k_in}, {k_out}")
    order = np.argsort(scores, kind="stable")  # ascending
    guessed_out, guessed_in = order[:k_out], order[len(order) - k_in:]
    correct = int(included[guessed_in].sum() + (~included[guessed_out]).sum())
    return Guesses(k_in, k_out, correct)


def default_pairs(canaries: int) -> tuple[tuple[int, int], ...]:
    """The (k₊, k₋) pairs tried by default: r ∈ {m/100, m/50, m/20, m/10, m/5, m/2, m} split
    evenly, and the same r as "in" guesses only (at least one guess each)."""
    totals = sorted({min(canaries, max(2, round(canaries * f))) for f in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)})
    return tuple((t // 2, t - t // 2) for t in totals) + tuple((t, 0) for t in totals)


@dataclass(frozen=True)
class OneRunBound:
    """The audit's answer: the ε lower bound and the guesses behind it."""

    epsilon_lower_bound: float
    confidence: float
    canaries: int
    guesses: int
    correct: int
    k_in: int
    k_out: int
    pairs_tried: int


def best_guesses(scores: np.ndarray, included: np.ndarray, delta: float,
                 confidence: float = DEFAULT_CONFIDENCE,
                 pairs: Sequence[tuple[int, int]] | None = None) -> OneRunBound:
    """The highest lower bound over ``pairs`` of (k₊, k₋), each computed at confidence
    1 − (1 − ``confidence``)/len(pairs), so the one reported holds at ``confidence``."""
    m = len(scores)
    pairs = tuple(pairs) if pairs is not None else default_pairs(m)
    if not pairs:
        raise ValueError("no (k_in, k_out) pair to try")
    each = 1 - (1 - confidence) / len(pairs)
    tried = [score_guesses(scores, included, k_in, k_out) for k_in, k_out in pairs]
    bound, guess = max(((epsilon_lower_bound(m, g.guesses, g.correct, delta, each), g) for g in tried),
                       key=lambda pair: pair[0])
    return OneRunBound(bound, confidence, m, guess.guesses, guess.correct, guess.k_in, guess.k_out, len(pairs))
