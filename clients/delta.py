"""δ against the size N of the data it protects: (ε, δ)-DP with δ ≥ 1/N allows a mechanism
that publishes one record outright, so a node refuses it; δ > 1/(10·N) is logged as a warning.

N must be public or already released (the ClientApp's released count; the classic app's
share of a public data set): the check's outcome reveals whether N ≤ 1/δ, which is then
post-processing, never a new release. ``delta_fit`` is the one rule; the simulation
commands apply it to their nodes' shares before they start anything.
"""

from __future__ import annotations

import enum
import logging

from clients.releases import Refusal

log = logging.getLogger(__name__)


class DeltaFit(enum.Enum):
    """How δ fits N records."""

    OK = "ok"
    WEAK = "weak"  # δ > 1/(10·N): allowed, warned
    TOO_LARGE = "too large"  # δ ≥ 1/N (or no records): refused


def delta_fit(delta: float, num_examples: int) -> DeltaFit:
    """The rule; compared as δ ≥ 1/N, not δ·N ≥ 1 (δ = 1/N can round to δ·N < 1)."""
    if num_examples < 1 or delta >= 1 / num_examples:
        return DeltaFit.TOO_LARGE
    return DeltaFit.WEAK if delta > 1 / (10 * num_examples) else DeltaFit.OK


def check_delta(delta: float, num_examples: int) -> None:
    """``Refusal`` when δ is too large for ``num_examples``; a logged warning when weak.
    The refusal names δ, never N."""
    fit = delta_fit(delta, num_examples)
    if fit is DeltaFit.TOO_LARGE:
        raise Refusal(f"delta = {delta:g} is too large for this node's data: (epsilon, delta)-DP needs "
                      "delta < 1/N, N its number of records (lower the policy's or the run's delta)")
    if fit is DeltaFit.WEAK:
        log.warning("delta = %g exceeds 1/(10 N) for this node's %d records: a weak guarantee", delta, num_examples)
