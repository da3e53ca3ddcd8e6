"""The masks of secure aggregation: ChaCha20 keystreams read as integers mod 2^bits.

Flower's ``secaggplus_utils.pseudo_rand_gen`` seeds NumPy's Mersenne Twister with a 32-bit
XOR-fold of the 32-byte key (2^32 possible masks, found by brute force from one masked
vector) and ``randint(0, range - 1)`` never draws ``range - 1`` (not uniform): it is not used
here. A mask is the ChaCha20 keystream (RFC 7539, ``cryptography``) under the 32-byte key,
counter 0 and a 12-byte nonce that binds what the mask is for and the round's key, so no two
masks share a stream; 2^bits divides the word range, so every element is uniform.
"""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

MAX_BITS = 64


def word_bytes(modulus_bits: int) -> int:
    """Bytes per element on the wire and in the keystream: 4 up to 32 bits, else 8."""
    return 4 if modulus_bits <= 32 else 8


def reduce(vector: np.ndarray, modulus_bits: int) -> np.ndarray:
    """``vector`` mod 2^modulus_bits as uint64 (uint64 arithmetic wraps mod 2^64 already)."""
    vector = vector.astype(np.uint64, copy=False)
    if modulus_bits == MAX_BITS:
        return vector
    return vector & np.uint64((1 << modulus_bits) - 1)


def mask(key: bytes, purpose: str, round_key: str, dimension: int, modulus_bits: int) -> np.ndarray:
    """``dimension`` uniform elements of Z_{2^modulus_bits} (uint64) expanded from ``key``
    (32 bytes) for ``purpose`` in the round ``round_key``."""
    if len(key) != 32:
        raise ValueError(f"a mask key is 32 bytes, got {len(key)}")
    label = b"fedpriv.secagg\0" + purpose.encode() + b"\0" + round_key.encode()
    nonce = bytes(4) + hashlib.sha256(label).digest()[:12]  # counter 0, then the 96-bit nonce
    width = word_bytes(modulus_bits)
    stream = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(dimension * width))
    return reduce(np.frombuffer(stream, dtype=f"<u{width}"), modulus_bits)


def to_wire(vector: np.ndarray, modulus_bits: int) -> bytes:
    """A vector of Z_{2^modulus_bits} as little-endian words."""
    return vector.astype(f"<u{word_bytes(modulus_bits)}").tobytes()


def from_wire(data: object, dimension: int, modulus_bits: int) -> np.ndarray:
    """The vector ``to_wire`` wrote; ValueError unless ``data`` holds exactly ``dimension`` words."""
    width = word_bytes(modulus_bits)
    if not isinstance(data, bytes) or len(data) != dimension * width:
        raise ValueError(f"a masked vector is {dimension * width} bytes")
    return reduce(np.frombuffer(data, dtype=f"<u{width}"), modulus_bits)
