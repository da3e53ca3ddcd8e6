"""The deployment's TLS material, checked by OpenSSL (Python's ``ssl``), not by the code that made it."""

import socket
import ssl
import stat
import threading

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedpriv.certificates import main, write_node_key, write_tls
from tests.timeouts import scaled


def _handshake(server_files, client_ca, host="127.0.0.1") -> None:
    """A TLS handshake on loopback: the server presents its certificate, the client checks it
    against ``client_ca`` and ``host``; raises ``ssl.SSLError`` when verification fails."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(server_files.cert, server_files.key)
    client_ctx = ssl.create_default_context(cafile=str(client_ca))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve():
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=scaled(10)) as raw:
                with client_ctx.wrap_socket(raw, server_hostname=host) as tls:
                    tls.sendall(b"x")
        finally:
            thread.join(timeout=scaled(10))


def test_the_superlink_certificate_verifies_against_its_ca_only(tmp_path):
    files = write_tls(tmp_path / "a", ["127.0.0.1", "localhost"])
    _handshake(files, files.ca_cert)  # the right CA and address
    _handshake(files, files.ca_cert, host="localhost")
    other = write_tls(tmp_path / "b", ["127.0.0.1"])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(files, other.ca_cert)  # a node holding another CA refuses the SuperLink
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(files, files.ca_cert, host="superlink.example.org")  # a name not in the certificate


def test_private_keys_are_owner_only_and_a_ca_is_never_replaced(tmp_path, capsys):
    files = main(["--out", str(tmp_path), "--host", "127.0.0.1"])
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600 and stat.S_IMODE(files.ca_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.ca_cert.stat().st_mode) == 0o644
    assert "keep offline" in capsys.readouterr().out
    before = files.ca_key.read_bytes()
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path), "--host", "127.0.0.1"])
    assert exit_.value.code == 2 and files.ca_key.read_bytes() == before


def test_a_node_key_is_what_flower_reads_and_is_never_replaced(tmp_path):
    private, public = write_node_key(tmp_path, "node0")
    key = serialization.load_ssh_private_key(private.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert serialization.load_ssh_public_key(public.read_bytes()) == key.public_key()
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        write_node_key(tmp_path, "node0")
