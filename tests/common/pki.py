"""A test CA with server and client certificates for ``localhost`` and 127.0.0.1, written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None,
          issuer_key: ec.EllipticCurvePrivateKey | None, ca: bool, names: Sequence[str] = ()) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in ("localhost", *names)]
                                        + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key or key, hashes.SHA256())


def write_pki(tmp_path: Path, names: Sequence[str] = ()) -> dict[str, Path]:
    """ca, server_cert, server_key, client_cert, client_key; the certificates also name ``names``."""
    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("ragr1-test-ca", ca_key, None, None, ca=True)
    files: dict[str, Path] = {"ca": tmp_path / "ca.pem"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for who in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert("localhost", key, ca.subject, ca_key, ca=False, names=names)
        files[f"{who}_cert"] = tmp_path / f"{who}.pem"
        files[f"{who}_key"] = tmp_path / f"{who}.key"
        files[f"{who}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{who}_key"].write_bytes(pem_key(key))
    return files
