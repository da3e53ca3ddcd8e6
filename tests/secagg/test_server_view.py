"""What the server sees of a secure sum: each node's masked vector on its own is uniform on
Z_{2^32} (chi-square on the top 8 bits, KS against the uniform law) and independent of the
node's input (two very different inputs give indistinguishable masked vectors: two-sample
KS), while the unmasked sum of the recorded round is the exact sum of the inputs."""

from __future__ import annotations

import numpy as np
from scipy import stats

from fedpriv.secagg import Stage, prg
from tests.secagg.simulate import simulate

D = 40_000
FAMILY_ALPHA = 1e-4
"""The chance that a run with uniform, input-independent masks fails (the masks come from
fresh ECDH keys: every run draws new ones). Each of ``check_masked_vectors``' 2n + 3 tests
takes its Bonferroni share: at 1e-3 each, a correct protocol failed about 1 run in 80."""


def masked_vectors(inputs: dict[int, np.ndarray], seed: int,
                   neighbours: int = 0) -> tuple[dict[int, np.ndarray], object]:
    r = simulate(len(inputs), D, vectors=inputs, seed=seed, neighbours=neighbours)
    everything = [(stage, node, reply) for stage, node, reply in r.received]
    vectors = {node: prg.from_wire(reply["masked"], D, 32) for stage, node, reply in everything
               if stage is Stage.COLLECT}
    assert set(vectors) == set(inputs)
    return vectors, r


def test_each_masked_vector_alone_is_uniform_and_independent_of_the_input() -> None:
    check_masked_vectors(5)


def check_masked_vectors(n: int, neighbours: int = 0) -> None:
    """Each of ``n`` nodes' masked vectors (SecAgg+ with ``neighbours``) is uniform, and node
    11's is independent of its input; the same tests see the inputs' difference at once."""
    nodes = range(11, 11 + n)
    alpha = FAMILY_ALPHA / (2 * n + 3)  # n + 1 vectors × (chi-square, KS), one two-sample KS
    zeros = {u: np.zeros(D, dtype=np.uint64) for u in nodes}
    ramp = np.arange(D, dtype=np.uint64) * 104_729 % (1 << 32)  # spans the range, very unlike 0
    other = {u: (ramp if u == 11 else np.zeros(D, dtype=np.uint64)) for u in nodes}
    seen_zero, r = masked_vectors(zeros, seed=1, neighbours=neighbours)
    seen_ramp, _ = masked_vectors(other, seed=2, neighbours=neighbours)
    assert np.array_equal(r.result.sum, np.zeros(D, dtype=np.uint64))
    for vector in list(seen_zero.values()) + [seen_ramp[11]]:
        top = (vector >> np.uint64(24)).astype(np.int64)
        assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > alpha
        assert stats.kstest(vector / 2.0**32, "uniform").pvalue > alpha
    assert stats.ks_2samp(seen_zero[11] / 2.0**32, seen_ramp[11] / 2.0**32).pvalue > alpha
    # the input itself is far from uniform: the same tests see it at once
    assert stats.ks_2samp(zeros[11] / 2.0**32, ramp / 2.0**32).pvalue < alpha


def test_the_recorded_round_decodes_to_the_exact_sum() -> None:
    r = simulate(6, 2000, seed=3)
    assert r.result.reason is None
    assert np.array_equal(r.result.sum, r.true_sum(32))
    stages = {stage for stage, _, _ in r.received}
    assert stages == set(Stage)
    assert all(set(reply) <= {"pk1", "pk2", "pk3", "destinations", "ciphertexts", "commitment", "masked", "settings",
                              "signature", "ids", "shares"}
               for _, _, reply in r.received)
