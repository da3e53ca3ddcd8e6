"""The five stages of a secure sum and the names of their fields on the wire."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

RECORD_KEY = "fedpriv.secagg"
"""The ConfigRecord of a message that holds the stage's fields (both directions)."""


class Stage(StrEnum):
    """SecAgg+ (Bell et al. 2020), in the order a node answers them."""

    SETUP = "setup"  # → threshold, modulus bits, dimension, round key; ← three public keys (signed by its identity)
    SHARE_KEYS = "share-keys"  # → the cohort's keys and identities; ← encrypted shares, commitment to b
    COLLECT = "collect"  # → the shares sent to this node; ← the masked vector, the digest of its settings
    CONSISTENCY = "consistency"  # → the survivors; ← the node's signature on them and the settings
    UNMASK = "unmask"  # → active (signed by >= t) and dead lists; ← shares of b (active), sk1 (dead)


STAGE = "stage"
# setup
THRESHOLD, MODULUS_BITS, DIMENSION, ROUND_KEY = "threshold", "modulus-bits", "dimension", "round-key"
PK1, PK2, PK3 = "pk1", "pk2", "pk3"
CERTIFICATE, KEYS_SIGNATURE = "certificate", "keys-signature"  # its identity (b"" without one)
# share-keys (ids: the nodes it shares with, itself included; cohort: all of U1, sent on a sparse graph only)
IDS, COHORT = "ids", "cohort"
# aligned with the cohort: its identities, and (sparse graph) the digests of the keys they signed
CERTIFICATES, KEYS_SIGNATURES, KEYS_DIGESTS = "certificates", "keys-signatures", "keys-digests"
DESTINATIONS, CIPHERTEXTS, COMMITMENT = "destinations", "ciphertexts", "commitment"
# collect
SOURCES, MASKED, SETTINGS = "sources", "masked", "settings"
# consistency (Bonawitz et al. 2017, the malicious-server variant)
SIGNATURE = "signature"
# unmask
ACTIVE, DEAD, SHARES, SIGNERS, SIGNATURES = "active", "dead", "shares", "signers", "signatures"

MAX_DIMENSION = 1 << 28
MAX_ROUND_KEY = 256
MAX_CIPHERTEXT_BYTES = 4096
MAX_SHARE_BYTES = 1024
MAX_SIGNATURE_BYTES = 512


def typed_list(config: Mapping[str, Any], name: str, kind: type, error: Callable[[str], Exception]) -> list[Any]:
    """``config[name]`` if it is a list of exactly ``kind`` (bool is no int here), else
    ``error(reason)`` raised: every list in a stage's config or reply is untrusted."""
    value = config.get(name)
    if not isinstance(value, list) or any(type(item) is not kind for item in value):
        raise error(f"{name} must be a list of {kind.__name__}")
    return value
