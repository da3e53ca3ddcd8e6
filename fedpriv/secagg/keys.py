"""Key material shared by the node's and the server's side, from Flower's primitives.

Key agreement and key serialisation are ``flwr.supercore.primitives.asymmetric`` (P-384,
PEM), the shared key is ``symmetric_encryption.generate_shared_key`` (ECDH + HKDF-SHA256,
URL-safe base64 for Fernet). The first secret key is Shamir-shared as its 48-byte scalar
(not its PEM text: four Shamir chunks instead of twelve), which the server checks against
the node's public key after reconstructing it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    public_key_to_bytes,
    verify_signature,
)

SCALAR_BYTES = 48  # P-384
MAX_KEY_BYTES = 1024


def public_key(data: object) -> ec.EllipticCurvePublicKey:
    """``data`` as a P-384 public key (PEM); ValueError for anything else."""
    if not isinstance(data, bytes) or len(data) > MAX_KEY_BYTES:
        raise ValueError("a public key is PEM bytes")
    try:
        key = bytes_to_public_key(data)
    except Exception as err:  # cryptography raises ValueError or UnsupportedAlgorithm
        raise ValueError("a public key is not a PEM P-384 key") from err
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        raise ValueError("a public key is not a PEM P-384 key")
    return key


def scalar(private_pem: bytes) -> bytes:
    """The 48-byte secret scalar of a PEM private key (what is Shamir-shared)."""
    numbers = bytes_to_private_key(private_pem).private_numbers()
    return numbers.private_value.to_bytes(SCALAR_BYTES, "big")


def private_key(secret: bytes) -> ec.EllipticCurvePrivateKey:
    """The P-384 private key of a 48-byte scalar; ValueError when it is not one."""
    if len(secret) != SCALAR_BYTES:
        raise ValueError("a secret key scalar is 48 bytes")
    return ec.derive_private_key(int.from_bytes(secret, "big"), ec.SECP384R1())


def matches(secret: bytes, public_pem: bytes) -> bool:
    """Whether the scalar ``secret`` is the private key of ``public_pem``."""
    try:
        return public_key_to_bytes(private_key(secret).public_key()) == public_pem
    except ValueError:
        return False


def settings_digest(settings: Mapping[str, Any]) -> bytes:
    """SHA-256 of ``settings`` (JSON values) in canonical JSON: one round's settings as a node saw them."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(b"fedpriv.secagg.settings\0" + text.encode()).digest()


def mask_key(private: ec.EllipticCurvePrivateKey, public: ec.EllipticCurvePublicKey, settings: bytes) -> bytes:
    """The 32-byte pairwise mask key both ends of a pair derive (ECDH, HKDF) for the round
    ``settings`` (a ``settings_digest``, HKDF's info): two nodes given different settings
    derive unrelated keys, so their masks do not cancel and no sum is decodable."""
    shared = base64.urlsafe_b64decode(generate_shared_key(private, public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"fedpriv.secagg.pairwise\0" + settings).derive(shared)


def survivors_message(round_key: str, active: list[int], settings: bytes) -> bytes:
    """What a node signs at the consistency stage: the round, its sorted survivors and the
    round's ``settings`` digest."""
    return (b"fedpriv.secagg.survivors\0" + round_key.encode() + b"\0" + ",".join(map(str, sorted(active))).encode()
            + b"\0" + settings)


def keys_digest(round_key: str, node_id: int, pk1: bytes, pk2: bytes, pk3: bytes) -> bytes:
    """SHA-256 of a node's id and public keys in one round (what its identity signs)."""
    digest = hashlib.sha256(b"fedpriv.secagg.keys\0")
    for part in (round_key.encode(), str(node_id).encode(), pk1, pk2, pk3):
        digest.update(len(part).to_bytes(4, "big") + part)
    return digest.digest()


def signed(public_pem: bytes, message: bytes, signature: object) -> bool:
    """Whether ``signature`` is the ECDSA-SHA256 signature of ``message`` under ``public_pem``."""
    return isinstance(signature, bytes) and verify_signature(public_key(public_pem), message, signature)


def commitment(round_key: str, secret: bytes) -> bytes:
    """SHA-256 commitment to a node's private-mask seed, sent before the shares are: the
    server checks the seed it reconstructs, so a wrong share fails the check, not the sum."""
    return hashlib.sha256(b"fedpriv.secagg.seed\0" + round_key.encode() + b"\0" + secret).digest()
