"""Black-box ε lower bounds from counts: Clopper–Pearson intervals on the probability of
one output set S under two neighbouring inputs.

(ε, δ)-DP says P[M(D) ∈ S] ≤ e^ε P[M(D′) ∈ S] + δ for every S, so with p̲ a lower
confidence bound on P[M(D) ∈ S] and p̄′ an upper one on P[M(D′) ∈ S],
ε ≥ ln((p̲ − δ) / p̄′).  Each one-sided bound is exact (Clopper–Pearson, from the beta
distribution) at level (1 − confidence)/2, so both hold together at ``confidence``.
"""

from __future__ import annotations

import math

from scipy import stats


def lower_bound(successes: int, trials: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower bound on a binomial p at level 1 − ``alpha``."""
    if successes == 0:
        return 0.0
    return float(stats.beta.ppf(alpha, successes, trials - successes + 1))


def upper_bound(successes: int, trials: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper bound on a binomial p at level 1 − ``alpha``."""
    if successes == trials:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, successes + 1, trials - successes))


def epsilon_from_counts(hits: int, hits_neighbour: int, trials: int, delta: float, confidence: float) -> float:
    """ε ≥ ln((p̲ − δ)/p̄′) for ``hits`` of ``trials`` runs on D and ``hits_neighbour`` of as
    many on D′ landing in S, at ``confidence``; 0 where that is not positive."""
    if not 0 <= hits <= trials or not 0 <= hits_neighbour <= trials:
        raise ValueError(f"counts must lie in [0, {trials}], got {hits} and {hits_neighbour}")
    alpha = (1 - confidence) / 2
    low, high = lower_bound(hits, trials, alpha) - delta, upper_bound(hits_neighbour, trials, alpha)
    if low <= 0:
        return 0.0
    return max(0.0, math.log(low / high))
