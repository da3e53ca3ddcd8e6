"""The batched interpolation rebuilds exactly what Flower's ``combine_shares`` rebuilds."""

from __future__ import annotations

import os
import random

import pytest
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares

from fedpriv.secagg.lagrange import Interpolator


@pytest.mark.parametrize("size, threshold, holders", [(32, 2, 3), (32, 7, 12), (48, 14, 20), (48, 30, 44)])
def test_equals_flower_on_any_subset_and_order(size: int, threshold: int, holders: int) -> None:
    rng = random.Random(size * threshold)
    interpolator = Interpolator()
    for _ in range(6):
        secret = os.urandom(size)
        shares = create_shares(secret, threshold, holders)
        for subset in (shares[:threshold], rng.sample(shares, threshold), rng.sample(shares, threshold)):
            assert interpolator.combine(subset) == combine_shares(subset) == secret


def test_coefficients_are_shared_by_secrets_at_the_same_indices() -> None:
    interpolator = Interpolator()
    secrets = [os.urandom(32) for _ in range(5)]
    for i, secret in enumerate(secrets):
        first = create_shares(secret, 4, 9)[:4]
        assert interpolator.combine(first[i % 4:] + first[:i % 4]) == secret  # in any order
    assert len(interpolator._coefficients) == 1


def test_too_few_or_foreign_shares_do_not_rebuild_the_secret() -> None:
    secret, other = os.urandom(32), os.urandom(32)
    shares, foreign = create_shares(secret, 5, 8), create_shares(other, 5, 8)
    mixed = shares[:4] + foreign[4:5]
    for subset in (shares[:4], mixed):
        try:
            rebuilt = Interpolator().combine(subset)
        except ValueError:
            continue
        assert rebuilt != secret


@pytest.mark.parametrize("case", ["repeated", "sizes", "zero-index", "empty"])
def test_malformed_shares_raise_value_error(case: str) -> None:
    shares = create_shares(os.urandom(32), 3, 5)
    bad = {"repeated": [shares[0], shares[0], shares[1]],
           "sizes": [shares[0], shares[1] + b"\0" * 16, shares[2]],
           "zero-index": [b"\0\0\0\0" + shares[0][4:], shares[1], shares[2]],
           "empty": []}[case]
    with pytest.raises(ValueError):
        Interpolator().combine(bad)
