"""δ against the size N of the data it protects: (ε, δ)-DP with δ ≥ 1/N allows a mechanism
that publishes one record outright, so a node refuses it; δ > 1/(10·N) is logged as a warning.

N must be public or already released (the ClientApp's released count; the classic app's
share of a public data set): the check's outcome reveals whether N ≤ 1/δ, which is then
post-processing, never a new release.
"""

from __future__ import annotations

import logging

from clients.releases import Refusal

log = logging.getLogger(__name__)


def check_delta(delta: float, num_examples: int) -> None:
    """``Refusal`` when δ ≥ 1/``num_examples`` (no records: always); a logged warning when
    δ > 1/(10·``num_examples``). The refusal names δ, never N."""
    if num_examples < 1 or delta * num_examples >= 1:
        raise Refusal(f"delta = {delta:g} is too large for this node's data: (epsilon, delta)-DP needs "
                      "delta < 1/N, N its number of records (lower the policy's or the run's delta)")
    if delta * num_examples * 10 > 1:
        log.warning("delta = %g exceeds 1/(10 N) for this node's %d records: a weak guarantee", delta, num_examples)
