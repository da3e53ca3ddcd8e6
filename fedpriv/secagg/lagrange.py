"""Rebuilding many Shamir secrets at once: Flower's ``combine_shares`` with the Lagrange
coefficients computed once per set of share indices instead of once per secret.

Flower's shares (``flwr.common.secure_aggregation.crypto.shamir``) are a 4-byte index x
followed by one 16-byte share of each chunk of the padded secret, each chunk shared over
GF(2^128) by PyCryptodome's ``Shamir.split``. A secret's chunk is Σ_j λ_j·y_j with
λ_j = Π_{m≠j} x_m / (x_j + x_m) (PyCryptodome's ``Shamir.combine``, characteristic 2), and
λ depends only on the indices. In a secure sum every node's secrets are shared at the
same indices 1..n−1 and the server takes the first t shares, so one set of λ serves almost
every secret: O(t) field multiplications per chunk instead of O(t²), and t inverses per
set instead of t per chunk. The field arithmetic is PyCryptodome's own; the result equals
``combine_shares`` on the same shares (tests/secagg/test_lagrange.py), and the server still
checks every rebuilt secret against its commitment or public key before using it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from Crypto.Protocol.SecretSharing import _Element
from Crypto.Util.Padding import unpad

Element: Any = _Element
"""PyCryptodome's GF(2^128), what its Shamir uses (typed Any: its stub lacks the operators)."""

INDEX_BYTES, CHUNK_BYTES = 4, 16


class Interpolator:
    """``combine(shares)`` as Flower's ``combine_shares``, with λ cached per index set."""

    def __init__(self) -> None:
        self._coefficients: dict[tuple[int, ...], list[Any]] = {}

    def combine(self, shares: Sequence[bytes]) -> bytes:
        """The secret the shares (Flower's format, one per index) rebuild; ValueError when
        they are malformed, repeat an index or do not unpad (not shares of one secret)."""
        if not shares or any(len(share) != len(shares[0]) or (len(share) - INDEX_BYTES) % CHUNK_BYTES
                             for share in shares):
            raise ValueError("shares of different or wrong sizes")
        shares = sorted(shares, key=lambda share: share[:INDEX_BYTES][::-1])  # one cache entry per index set
        indices = tuple(int.from_bytes(share[:INDEX_BYTES], "little") for share in shares)
        coefficients = self._lagrange(indices)
        chunks = (len(shares[0]) - INDEX_BYTES) // CHUNK_BYTES
        padded = bytearray()
        for c in range(chunks):
            start = INDEX_BYTES + c * CHUNK_BYTES
            value = Element(0)
            for weight, share in zip(coefficients, shares, strict=True):
                value += weight * Element(share[start:start + CHUNK_BYTES])
            padded += value.encode()
        try:
            return unpad(bytes(padded), CHUNK_BYTES)
        except ValueError:
            raise ValueError("Failed to combine shares") from None

    def _lagrange(self, indices: tuple[int, ...]) -> list[Any]:
        """λ_j at 0 for the points ``indices`` (cached)."""
        if indices not in self._coefficients:
            if len(set(indices)) != len(indices) or 0 in indices:
                raise ValueError("repeated or zero share index")
            points = [Element(x) for x in indices]
            weights = []
            for j, x_j in enumerate(points):
                numerator, denominator = Element(1), Element(1)
                for m, x_m in enumerate(points):
                    if m != j:
                        numerator *= x_m
                        denominator *= x_j + x_m
                weights.append(numerator * denominator.inverse())
            self._coefficients[indices] = weights
        return self._coefficients[indices]
