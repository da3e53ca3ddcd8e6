"""Black-box audits of every mechanism that releases something (DP-Sniper style).

Each case of ``fedpriv.audit.mechanism_cases.CASES`` runs the library's own mechanism on
two worst-case neighbouring inputs D and D′, n times each with a seeded generator, each
output reduced to the log-likelihood ratio of D′ against D under the claimed noise (a 1-D
projection on which threshold sets are the most powerful tests).  A first batch of runs
chooses the threshold set S (the side and the threshold with the best bound among
``THRESHOLDS`` quantiles); a fresh batch of n runs per input then bounds ε with
Clopper–Pearson intervals (``clopper_pearson``), so the choice does not bias the bound.
``noise_factor`` < 1 is the negative control: that fraction of the noise, the claim kept.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from fedpriv.audit.clopper_pearson import epsilon_from_counts
from fedpriv.audit.mechanism_cases import CASES
from fedpriv.audit.one_run import DEFAULT_CONFIDENCE

THRESHOLDS = 200
"""Candidate thresholds: this many quantiles of the selection runs' statistics."""


def _best_set(stats_d: np.ndarray, stats_d2: np.ndarray, delta: float, confidence: float
              ) -> tuple[float, bool, float]:
    """(threshold, upper, bound): S = {s ≥ t} against D (``upper``) or {s < t} against D′,
    whichever bound on the selection runs is the best."""
    pooled = np.concatenate([stats_d, stats_d2])
    best = (0.0, True, -1.0)
    n = len(stats_d)
    for t in np.unique(np.quantile(pooled, np.linspace(0, 1, THRESHOLDS + 2)[1:-1])):
        above_d, above_d2 = int((stats_d >= t).sum()), int((stats_d2 >= t).sum())
        for upper, hits, hits_other in ((True, above_d2, above_d), (False, n - above_d, n - above_d2)):
            bound = epsilon_from_counts(hits, hits_other, n, delta, confidence)
            if bound > best[2]:
                best = (float(t), upper, bound)
    return best


def audit_mechanism(name: str, epsilon: float, trials: int | None = None, seed: int = 0,
                    noise_factor: float = 1.0, confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
    """Audit mechanism ``name`` (a key of ``CASES``) at target ε; the result as the command writes it."""
    if name not in CASES:
        raise ValueError(f"unknown mechanism {name!r}; choose one of {', '.join(CASES)}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not 0 < noise_factor <= 1:
        raise ValueError(f"noise_factor must be in (0, 1], got {noise_factor!r}")
    case = CASES[name]
    n = case.default_trials if trials is None else trials
    if n < 10:
        raise ValueError(f"trials must be >= 10, got {n}")
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    selection = max(500, n // 4)
    threshold, upper, _ = _best_set(case.sample(0, selection, rng, epsilon, noise_factor),
                                    case.sample(1, selection, rng, epsilon, noise_factor), case.delta, confidence)
    stats_d, stats_d2 = case.sample(0, n, rng, epsilon, noise_factor), case.sample(1, n, rng, epsilon, noise_factor)
    above_d, above_d2 = int((stats_d >= threshold).sum()), int((stats_d2 >= threshold).sum())
    hits, hits_other = (above_d2, above_d) if upper else (n - above_d, n - above_d2)
    claimed = case.claimed(epsilon)
    bound = epsilon_from_counts(hits, hits_other, n, case.delta, confidence)
    return {
        "mechanism": name,
        "description": case.description,
        "claimed_epsilon": claimed,
        "epsilon_lower_bound": bound,
        "confidence": confidence,
        "delta": case.delta,
        "trials": n,
        "selection_trials": selection,
        "noise_factor": noise_factor,
        "flagged": bound > claimed,
        "method": "Clopper–Pearson on a threshold set of the likelihood ratio (chosen on separate runs)",
        "set": {"threshold": threshold, "side": ">=" if upper else "<", "hits": hits, "hits_neighbour": hits_other},
        "seed": seed,
        "seconds": round(time.perf_counter() - start, 2),
    }
