"""Peers with identities: a node counts another toward its cohort only if that node's
secure-aggregation keys of the round are signed by an identity key that a consortium CA
named in the node's own policy certifies (``fedpriv.certificates``). The server relays the
certificates and signatures but, holding no identity the CA certified, cannot add nodes
of its own (Sybils) to an honest node's cohort (``docs/threat-model.md``).

Each node signs ``keys.keys_message`` (the round key, its id and its three public keys) with
its identity key (ECDSA P-256, SHA-256); a certificate is checked against the CA once per
process (its validity period on every use).
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedpriv.certificates import IDENTITY_CERT, IDENTITY_KEY, certified_key

MAX_CERTIFICATE_BYTES = 4096


@dataclass(frozen=True)
class Identity:
    """A node's consortium identity: the CA it trusts, its own certificate (PEM) and key."""

    ca: x509.Certificate
    certificate: bytes
    key: ec.EllipticCurvePrivateKey

    def sign(self, message: bytes) -> bytes:
        return self.key.sign(message, ec.ECDSA(hashes.SHA256()))


@functools.lru_cache(maxsize=64)
def load_identity(ca_file: Path, folder: Path) -> Identity:
    """The identity in ``folder`` (``identity.pem``, ``identity.key``) under the CA in ``ca_file``;
    ValueError (no path named: it may reach the server) when the files are missing or the
    CA did not certify that key."""
    try:
        ca = x509.load_pem_x509_certificate(ca_file.read_bytes())
        certificate = (folder / IDENTITY_CERT).read_bytes()
        key = serialization.load_pem_private_key((folder / IDENTITY_KEY).read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        raise ValueError("this node's secagg-ca or secagg-identity files are missing or unreadable") from None
    try:
        certified = certified_key(ca, certificate)
    except ValueError as err:
        raise ValueError(f"this node's secagg-identity is not certified by its secagg-ca: {err}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or \
            certified.public_numbers() != key.public_key().public_numbers():
        raise ValueError("this node's secagg-identity key is not the key its certificate names")
    return Identity(ca, certificate, key)


@functools.lru_cache(maxsize=4096)
def _certificate(ca: x509.Certificate, certificate: bytes) -> tuple[ec.EllipticCurvePublicKey, bytes, x509.Certificate]:
    """(key, the key as DER, the certificate) of a certificate the CA issued, its validity
    period aside: checked once per process."""
    try:
        cert = x509.load_pem_x509_certificate(certificate)
    except ValueError:
        raise ValueError("not a PEM certificate") from None
    key = certified_key(ca, certificate, now=cert.not_valid_before_utc)
    return key, key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo), cert


def peer_identity(ca: x509.Certificate, certificate: object, signature: object, message: bytes) -> bytes:
    """The identity (its key, DER) that signed ``message`` with ``signature`` if ``ca``
    certifies it and the certificate is valid now; ValueError otherwise."""
    if not isinstance(certificate, bytes) or not 0 < len(certificate) <= MAX_CERTIFICATE_BYTES:
        raise ValueError("no identity certificate")
    key, identity, cert = _certificate(ca, certificate)
    if not cert.not_valid_before_utc <= datetime.datetime.now(datetime.UTC) <= cert.not_valid_after_utc:
        raise ValueError("the identity certificate is outside its validity period")
    if not isinstance(signature, bytes):
        raise ValueError("no signature on its keys")
    try:
        key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise ValueError("its keys are not signed by its identity") from None
    return identity
