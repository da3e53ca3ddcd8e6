"""The four stages of a secure sum and the names of their fields on the wire."""

from __future__ import annotations

from enum import StrEnum

RECORD_KEY = "fedpriv.secagg"
"""The ConfigRecord of a message that holds the stage's fields (both directions)."""


class Stage(StrEnum):
    """SecAgg+ (Bell et al. 2020) on the full graph, in the order a node answers them."""

    SETUP = "setup"  # → threshold, modulus bits, dimension, round key; ← two public keys
    SHARE_KEYS = "share-keys"  # → the cohort's keys; ← encrypted shares, commitment to b
    COLLECT = "collect"  # → the shares sent to this node; ← the masked vector
    UNMASK = "unmask"  # → active and dead lists; ← shares of b (active) and sk1 (dead)


STAGE = "stage"
# setup
THRESHOLD, MODULUS_BITS, DIMENSION, ROUND_KEY = "threshold", "modulus-bits", "dimension", "round-key"
PK1, PK2 = "pk1", "pk2"
# share-keys
IDS = "ids"
DESTINATIONS, CIPHERTEXTS, COMMITMENT = "destinations", "ciphertexts", "commitment"
# collect
SOURCES, MASKED = "sources", "masked"
# unmask
ACTIVE, DEAD, SHARES = "active", "dead", "shares"

MAX_DIMENSION = 1 << 28
MAX_ROUND_KEY = 256
MAX_CIPHERTEXT_BYTES = 4096
MAX_SHARE_BYTES = 1024
