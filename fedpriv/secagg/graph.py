"""SecAgg+'s communication graph (Bell, Bonawitz, Gascón, Lepoint, Raykova, CCS 2020): each
node masks with and shares its secrets among its k neighbours only, in a random k-regular
Harary graph H(n, k) drawn from a public seed. For k = O(log n) the honest survivors stay
connected with high probability against a server that does not choose the graph
(``docs/threat-model.md``); k = 0 or k ≥ n − 1 is the full graph.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence


def threshold(cohort: int, neighbours: int) -> int:
    """The reconstruction threshold t = ⌊2K/3⌋ + 1, K the nodes each node shares with (itself
    included: the cohort, or k + 1 on a sparse graph): a node with c colluders demands
    2t > K + c (so no two disjoint sets of t rebuild both of its secrets), which this meets
    for c < K/3; up to K − t of them may drop out."""
    group = cohort if neighbours == 0 else min(cohort, neighbours + 1)
    return 2 * group // 3 + 1


def harary(nodes: Sequence[int], neighbours: int, seed: str) -> dict[int, frozenset[int]] | None:
    """Each node's neighbours in H(n, k), k = ``neighbours`` (even), over the permutation of
    ``nodes`` that ``seed`` draws: the k/2 nodes before and after it on the shuffled ring.
    None (the full graph) when k = 0 or k ≥ n − 1."""
    if neighbours < 0 or neighbours % 2:
        raise ValueError(f"a Harary graph needs an even number of neighbours >= 0, got {neighbours}")
    n = len(nodes)
    if neighbours == 0 or neighbours >= n - 1:
        return None
    ring = sorted(nodes)
    random.Random(hashlib.sha256(b"fedpriv.secagg.graph\0" + seed.encode()).digest()).shuffle(ring)
    half = neighbours // 2
    return {ring[i]: frozenset(ring[(i + j) % n] for j in range(-half, half + 1) if j) for i in range(n)}
