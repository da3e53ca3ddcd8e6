"""The secure sum is exact: the unmasked sum equals the true modular sum of the survivors'
inputs (computed in Python integers), with nodes dropped before or after they masked, and a
round with too few survivors is discarded. Masks are ChaCha20 (checked against PyCryptodome's
independent implementation), never Flower's Mersenne-Twister ``pseudo_rand_gen``."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from Crypto.Cipher import ChaCha20 as ReferenceChaCha20

from fedpriv.secagg import Stage, prg
from tests.secagg.simulate import simulate


@pytest.mark.parametrize("n, bits", [(5, 32), (8, 20), (10, 64)])
def test_the_unmasked_sum_is_the_exact_modular_sum(n: int, bits: int) -> None:
    r = simulate(n, 300, bits=bits)
    assert r.result.reason is None and r.result.survivors == tuple(range(11, 11 + n))
    assert np.array_equal(r.result.sum, r.true_sum(bits))


@pytest.mark.parametrize("stage", [Stage.SHARE_KEYS, Stage.COLLECT, Stage.CONSISTENCY, Stage.UNMASK])
def test_twenty_percent_dropped_the_sum_over_the_survivors_is_exact(stage: Stage) -> None:
    dropped = {12, 17}  # 2 of 10
    r = simulate(10, 300, lose={stage: dropped})
    assert r.result.reason is None
    masked_before = stage in (Stage.CONSISTENCY, Stage.UNMASK)
    expected_survivors = set(range(11, 21)) - (set() if masked_before else dropped)
    assert set(r.result.survivors) == expected_survivors
    assert set(r.result.dropped) == dropped
    assert np.array_equal(r.result.sum, r.true_sum(32))


def test_too_few_survivors_discard_the_round() -> None:
    r = simulate(10, 50, threshold=7, lose={Stage.COLLECT: {11, 12, 13, 14}})
    assert r.result.sum is None and "threshold 7" in r.result.reason and r.result.survivors == ()


def test_too_few_unmask_answers_discard_the_round_rather_than_guess() -> None:
    r = simulate(10, 50, threshold=7, lose={Stage.UNMASK: {11, 12, 13, 14}})
    assert r.result.sum is None and "could not be rebuilt" in r.result.reason


def test_the_masks_are_the_chacha20_keystream_bound_to_purpose_and_round() -> None:
    key = bytes(range(32))
    for bits in (32, 17, 64):
        ours = prg.mask(key, "pairwise", "run/round-3", 1000, bits)
        nonce = hashlib.sha256(b"fedpriv.secagg\0pairwise\0run/round-3").digest()[:12]
        width = 4 if bits <= 32 else 8
        stream = ReferenceChaCha20.new(key=key, nonce=nonce).encrypt(bytes(1000 * width))
        words = [int.from_bytes(stream[i:i + width], "little") % (1 << bits) for i in range(0, len(stream), width)]
        assert ours.tolist() == words
    assert not np.array_equal(prg.mask(key, "pairwise", "r1", 64, 32), prg.mask(key, "private", "r1", 64, 32))
    assert not np.array_equal(prg.mask(key, "pairwise", "r1", 64, 32), prg.mask(key, "pairwise", "r2", 64, 32))
