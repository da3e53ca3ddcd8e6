"""A node's consortium identity and the policy keys that say whom it counts toward its cohort."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedpriv.certificates import certified_key, main, make_ca, make_identity, write_consortium
from fedpriv.federation.policy import PolicyError, SecAggTrust, load_policy
from fedpriv.secagg import keys
from fedpriv.secagg.identity import load_identity, peer_identity


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def test_a_certificate_counts_only_if_the_ca_issued_it_it_is_no_ca_and_it_is_valid_now() -> None:
    ca_key, ca = make_ca(name="consortium")
    other_key, other = make_ca(name="consortium")  # same name, another key: the server's
    _, good = make_identity(ca_key, ca, "a")
    _, forged = make_identity(other_key, other, "a")
    assert certified_key(ca, _pem(good)).public_numbers() == good.public_key().public_numbers()
    with pytest.raises(ValueError, match="not a certificate of the consortium CA"):
        certified_key(ca, _pem(forged))
    with pytest.raises(ValueError, match="a CA certificate is no node identity"):
        certified_key(ca, _pem(ca))
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=400)
    with pytest.raises(ValueError, match="outside its validity period"):
        certified_key(ca, _pem(good), now=later)


def test_a_peer_is_the_identity_that_signed_its_keys(tmp_path: Path) -> None:
    ca = write_consortium(tmp_path, ["a", "b"])
    a, b = load_identity(ca, tmp_path / "a"), load_identity(ca, tmp_path / "b")
    digest = keys.keys_digest("r", 1, b"pk1", b"pk2", b"pk3")
    assert peer_identity(a.ca, a.certificate, a.sign(digest), digest) != peer_identity(
        b.ca, b.certificate, b.sign(digest), digest)
    with pytest.raises(ValueError, match="not signed by its identity"):
        peer_identity(a.ca, a.certificate, b.sign(digest), digest)  # a's certificate, b's signature
    with pytest.raises(ValueError, match="not signed by its identity"):
        peer_identity(a.ca, a.certificate, a.sign(digest), keys.keys_digest("r", 2, b"pk1", b"pk2", b"pk3"))
    with pytest.raises(ValueError, match="not certified"):
        load_identity(write_consortium(tmp_path / "other", []), tmp_path / "a")


def test_the_consortium_command_makes_the_ca_once_and_an_identity_per_node(tmp_path: Path, capsys) -> None:
    ca = main(["consortium", "--out", str(tmp_path), "--node", "a"])
    before = (tmp_path / "ca.pem").read_bytes()
    main(["consortium", "--out", str(tmp_path), "--node", "a", "--node", "b"])
    assert (tmp_path / "ca.pem").read_bytes() == before  # kept: a's identity still verifies
    assert isinstance(ca, Path)
    for name in ("a", "b"):
        load_identity(tmp_path / "ca.pem", tmp_path / name)
    assert (tmp_path / "a" / "identity.key").stat().st_mode & 0o077 == 0
    assert "secagg-ca" in capsys.readouterr().out


def _policy(tmp_path: Path, **keys: object) -> dict[str, object]:
    return {"epsilon-budget": 1.0, "state-dir": str(tmp_path / "state"), "allow-distributed": True,
            "min-cohort": 4, "max-colluders": 1, **keys}


@pytest.mark.parametrize("keys_, trust, shares", [
    ({}, SecAggTrust.REFUSE, 3),
    ({"uncertified-cohort": "own-share"}, SecAggTrust.OWN_SHARE, 1),
    ({"trust-server-cohort": "true"}, SecAggTrust.SERVER_COHORT, 3),
    ({"secagg-ca": "/c/ca.pem", "secagg-identity": "/c/{partition-id}"}, SecAggTrust.CONSORTIUM_CA, 3),
])
def test_the_policy_says_whom_a_node_counts(tmp_path: Path, keys_: dict, trust: SecAggTrust, shares: int) -> None:
    policy = load_policy({**_policy(tmp_path, **keys_), "partition-id": 7}, environ={})
    assert policy.secagg_trust is trust and policy.honest_shares == shares
    if trust is SecAggTrust.CONSORTIUM_CA:
        assert policy.secagg_identity == Path("/c/7")


@pytest.mark.parametrize("keys_, why", [
    ({"secagg-ca": "/c/ca.pem"}, "go together"),
    ({"secagg-ca": "/c/ca.pem", "secagg-identity": "/c/a", "trust-server-cohort": True}, "one or the other"),
    ({"uncertified-cohort": "maybe"}, "uncertified-cohort"),
])
def test_a_contradictory_trust_policy_is_refused(tmp_path: Path, keys_: dict, why: str) -> None:
    with pytest.raises(PolicyError, match=why):
        load_policy(_policy(tmp_path, **keys_), environ={})
