"""Small X.509 helpers (cryptography): a CA, and certificates it signs.

Used for the throw-away control plane of tests and demos, and for the admission webhooks'
self-signed serving certificates. ECDSA P-256 keys: quick to make, accepted everywhere
Kubernetes looks.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    cert: bytes  # PEM
    key: bytes  # PEM (PKCS#8, unencrypted)

    def write(self, folder: Path, stem: str) -> tuple[Path, Path]:
        c, k = folder / f"{stem}.crt", folder / f"{stem}.key"
        c.write_bytes(self.cert)
        k.write_bytes(self.key)
        k.chmod(0o600)
        return c, k


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def make_ca(cn: str, days: int = 3650) -> Pair:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def issue(
    ca: Pair,
    cn: str,
    org: str | None = None,
    server_names: tuple[str, ...] = (),
    client: bool = False,
    days: int = 365,
) -> Pair:
    """A leaf certificate signed by `ca`: serving (with `server_names`, DNS names or IPs) or client."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    now = dt.datetime.now(dt.UTC)
    usage = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, org))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    )
    if server_names:
        sans: list[x509.GeneralName] = []
        for n in server_names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                sans.append(x509.DNSName(n))
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def expires(cert_pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def signing_key() -> tuple[bytes, bytes]:
    """A key pair for signing service-account tokens: (private PEM, public PEM)."""
    key = _key()
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _pem(key), pub
