"""TLS and SuperNode-authentication material for a deployment, made with the ``cryptography``
package: a private CA, the SuperLink's certificate for the names and addresses it is reached
at, and each SuperNode's key pair (Flower's format: OpenSSH, EC P-384).

```bash
python -m fedpriv.certificates --out certs/ --host superlink.example.org --node hospital-a --node hospital-b
flower-superlink --ssl-ca-certfile certs/ca.pem --ssl-certfile certs/superlink.pem \
    --ssl-keyfile certs/superlink.key --enable-supernode-auth ...
flwr supernode register certs/hospital-a.pub          # only registered nodes may join
flower-supernode --root-certificates certs/ca.pem --auth-supernode-private-key certs/hospital-a.key \
    --superlink superlink.example.org:9092 ...
```

Only ``ca.pem`` goes to the SuperNodes and to whoever runs ``flwr run``; ``ca.key`` signs
certificates and should be kept offline; ``superlink.key`` stays on the server. Keys are
ECDSA P-256, written with mode 0600; certificates are valid for ``days`` days.

Distributed DP's consortium (``docs/threat-model.md``): a CA that the nodes' operators hold
together and the server does not, which certifies each node's *identity* key; a node signs
its secure-aggregation keys with it each round, and its peers count it toward their honest
cohort only when that signature and its certificate verify (``fedpriv.secagg.identity``)::

    python -m fedpriv.certificates consortium --out consortium/ --node hospital-a --node hospital-b

writes ``consortium/ca.pem`` (every node's policy names it: ``secagg-ca``), ``consortium/ca.key``
(keep offline) and ``consortium/<name>/identity.pem`` and ``identity.key`` (that node's
``secagg-identity`` folder only).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedpriv.files import write_bytes_atomic


@dataclass(frozen=True)
class TlsFiles:
    """Where ``write_tls`` put each file."""

    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedpriv"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> x509.GeneralName:
    """An IP address entry for an address, a DNS entry for a name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _builder(days: int) -> x509.CertificateBuilder:
    """A certificate builder with a random serial, valid from five minutes ago (clock skew) for ``days``."""
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days)))


def _signing_usage(certifies: bool) -> x509.KeyUsage:
    """A key that signs: certificates too (a CA) or only messages (an identity)."""
    return x509.KeyUsage(digital_signature=True, key_cert_sign=certifies, crl_sign=certifies, content_commitment=False,
                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                         encipher_only=False, decipher_only=False)


def make_ca(days: int = 365, name: str = "fedpriv deployment CA") -> tuple[ec.EllipticCurvePrivateKey,
                                                                          x509.Certificate]:
    """A self-signed CA that may sign end-entity certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(days)
        .subject_name(_name(name)).issuer_name(_name(name))
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_signing_usage(certifies=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_server_certificate(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, hosts: list[str], days: int = 365
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A TLS server certificate for ``hosts`` (names and IP addresses), signed by the CA."""
    if not hosts:
        raise ValueError("a server certificate needs at least one host name or address")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(days)
        .subject_name(_name(hosts[0])).issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def make_identity(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, name: str, days: int = 365,
                  ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A node's identity certificate (signing only, not a CA) for ``name``, signed by the consortium CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(days)
        .subject_name(_name(name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_signing_usage(certifies=False), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def certified_key(ca_cert: x509.Certificate, cert_pem: bytes,
                  now: datetime.datetime | None = None) -> ec.EllipticCurvePublicKey:
    """The EC public key of ``cert_pem`` if ``ca_cert`` issued it directly (signature, issuer),
    it is no CA and it is valid ``now``; ValueError (one line) otherwise."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as err:
        raise ValueError(f"not a certificate of the consortium CA ({type(err).__name__})") from None
    now = now or datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise ValueError("the certificate is outside its validity period")
    try:
        if cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            raise ValueError("a CA certificate is no node identity")
    except x509.ExtensionNotFound:
        raise ValueError("an identity certificate states BasicConstraints") from None
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("an identity key is an EC key")
    return key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_tls(folder: str | os.PathLike[str], hosts: list[str], days: int = 365) -> TlsFiles:
    """Write ``ca.pem``/``ca.key`` and ``superlink.pem``/``superlink.key`` into ``folder``
    (keys with mode 0600); refuses to overwrite an existing CA key."""
    folder = Path(folder)
    files = TlsFiles(folder / "ca.pem", folder / "ca.key", folder / "superlink.pem", folder / "superlink.key")
    if files.ca_key.exists():
        raise FileExistsError(f"{files.ca_key} exists: refusing to replace a CA (delete it first if you mean to)")
    ca_key, ca_cert = make_ca(days)
    key, cert = make_server_certificate(ca_key, ca_cert, hosts, days)
    for path, data, private in ((files.ca_key, _key_pem(ca_key), True), (files.key, _key_pem(key), True),
                                (files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), False),
                                (files.cert, cert.public_bytes(serialization.Encoding.PEM), False)):
        write_bytes_atomic(path, data)  # created 0600 by mkstemp
        if not private:
            path.chmod(0o644)
    return files


def write_node_key(folder: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """A SuperNode's authentication key pair, in the OpenSSH formats Flower reads (EC P-384):
    ``<name>.key`` (mode 0600, for ``flower-supernode --auth-supernode-private-key``) and
    ``<name>.pub`` (for ``flwr supernode register``). Refuses to overwrite a key."""
    folder = Path(folder)
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    if private.exists():
        raise FileExistsError(f"{private} exists: refusing to replace a node's key")
    key = ec.generate_private_key(ec.SECP384R1())
    write_bytes_atomic(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                  serialization.NoEncryption()))
    write_bytes_atomic(public, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                             serialization.PublicFormat.OpenSSH) + b"\n")
    public.chmod(0o644)
    return private, public


def write_consortium(folder: str | os.PathLike[str], names: list[str], days: int = 365) -> Path:
    """``ca.pem``/``ca.key`` of a consortium CA in ``folder`` (made once, reused after) and an
    identity (``<name>/identity.pem``, ``identity.key``: ``write_identity``) for each of
    ``names`` that has none; returns the CA certificate's path."""
    folder = Path(folder)
    ca_pem, ca_key_path = folder / "ca.pem", folder / "ca.key"
    if ca_key_path.exists():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{ca_key_path} is not an EC key")
    else:
        ca_key, ca_cert = make_ca(days, "fedpriv consortium CA")
        write_bytes_atomic(ca_key_path, _key_pem(ca_key))
        write_bytes_atomic(ca_pem, ca_cert.public_bytes(serialization.Encoding.PEM))
        ca_pem.chmod(0o644)
    for name in names:
        if not (folder / name / IDENTITY_KEY).exists():
            write_identity(folder / name, ca_key, ca_cert, name, days)
    return ca_pem


IDENTITY_CERT, IDENTITY_KEY = "identity.pem", "identity.key"
"""The files of a node's ``secagg-identity`` folder."""


def write_identity(folder: str | os.PathLike[str], ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
                   name: str, days: int = 365) -> None:
    """``identity.key`` (mode 0600) and ``identity.pem`` of ``name``, certified by the CA, in ``folder``."""
    folder = Path(folder)
    key, cert = make_identity(ca_key, ca_cert, name, days)
    write_bytes_atomic(folder / IDENTITY_KEY, _key_pem(key))
    write_bytes_atomic(folder / IDENTITY_CERT, cert.public_bytes(serialization.Encoding.PEM))
    (folder / IDENTITY_CERT).chmod(0o644)


def consortium_main(argv: list[str]) -> Path:
    """``python -m fedpriv.certificates consortium --out DIR --node NAME...``."""
    parser = argparse.ArgumentParser(prog="python -m fedpriv.certificates consortium",
                                     description="Make a consortium CA and its nodes' identities (distributed DP).")
    parser.add_argument("--out", type=Path, required=True, help="folder for ca.pem, ca.key and NAME/identity.*")
    parser.add_argument("--node", action="append", required=True, help="a node's name (repeat for several)")
    parser.add_argument("--days", type=int, default=365, help="validity (default: 365)")
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error(f"argument --days: must be >= 1, got {args.days}")
    ca = write_consortium(args.out, args.node, args.days)
    print(f"wrote {ca} (every node's secagg-ca), {args.out / 'ca.key'} (keep offline), and an identity folder per "
          f"node (its secagg-identity): {', '.join(str(args.out / n) for n in args.node)}")
    return ca


def main(argv: list[str] | None = None) -> TlsFiles | Path:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["consortium"]:
        return consortium_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m fedpriv.certificates",
                                     description="Make a private CA and the SuperLink's TLS certificate.")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder for ca.pem, ca.key, superlink.pem, superlink.key")
    parser.add_argument("--host", action="append", required=True,
                        help="a name or IP address the SuperLink is reached at (repeat for several)")
    parser.add_argument("--days", type=int, default=365, help="validity (default: 365)")
    parser.add_argument("--node", action="append", default=[],
                        help="also make this SuperNode's authentication key pair, NAME.key / NAME.pub (repeat)")
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error(f"argument --days: must be >= 1, got {args.days}")
    try:
        files = write_tls(args.out, args.host, args.days)
        nodes = [write_node_key(args.out, name) for name in args.node]
    except (FileExistsError, ValueError) as err:
        parser.error(str(err))
    print(f"wrote {files.ca_cert} (give to SuperNodes and flwr), {files.cert} and {files.key} (SuperLink), "
          f"{files.ca_key} (keep offline)")
    for private, public in nodes:
        print(f"wrote {private} (that SuperNode only) and {public} (flwr supernode register {public})")
    return files


if __name__ == "__main__":
    main()
