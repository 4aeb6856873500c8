"""Serving certificates for the controller's webhooks (and any other HTTPS endpoint of a role).

Either generated (a throw-away CA signs one serving certificate for the given DNS names and IPs) or
loaded from files an operator provides, e.g. from cert-manager. The CA's private key is never
written anywhere: it signs once and is dropped, so a leaked state directory cannot mint new
certificates. The price is a new CA per generation, which is why callers re-register the webhook
configurations (their ``caBundle``) with whatever :attr:`ServingCertificate.ca_bundle` says.
Rotated files are taken up by :mod:`roles.common.cert_reload`, with the checks here (:func:`check_pair`).
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from roles.common.files import write_atomically

__all__ = [
    "CA_FILE",
    "CERT_FILE",
    "KEY_FILE",
    "ServingCertificate",
    "TlsError",
    "check_bundle",
    "check_pair",
    "generate_serving_certificate",
    "load_serving_certificate",
    "server_ssl_context",
]

CA_FILE: Final = "ca.crt"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
"""File names inside a generated directory: those of a kubernetes.io/tls Secret, plus the CA."""

_CLOCK_SKEW: Final = timedelta(minutes=5)
"""Back-dating of ``notBefore``, so a peer whose clock runs slightly behind still accepts it."""


class TlsError(ValueError):
    """A certificate or key that cannot be used; the message names the file."""


@dataclass(frozen=True, slots=True)
class ServingCertificate:
    """A serving certificate and key on disk, and the CA bundle clients verify it with."""

    cert_file: Path
    key_file: Path
    ca_bundle: bytes
    """PEM of the issuing CA: the ``caBundle`` of webhook configurations."""
    ca_file: Path | None = None
    """Where ``ca_bundle`` was read from; None when the certificate is its own bundle."""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def generate_serving_certificate(
    directory: Path,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = ("127.0.0.1",),
    common_name: str = "nodetaskd",
    valid_for: timedelta = timedelta(days=365),
    now: datetime | None = None,
) -> ServingCertificate:
    """Generate a CA and a serving certificate for ``dns_names`` and ``ip_addresses`` into ``directory``.

    Writes :data:`CA_FILE`, :data:`CERT_FILE` and :data:`KEY_FILE` (mode 0600), each atomically,
    replacing what was there. ``now`` defaults to the wall clock: certificates are checked against
    the peers' wall clocks, not the event loop's.

    Errors:
        :class:`ValueError` for an invalid IP address or when no name is given.
    """
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ips = [ipaddress.ip_address(ip) for ip in ip_addresses]
    start = (now or datetime.now(UTC)) - _CLOCK_SKEW
    end = start + _CLOCK_SKEW + valid_for

    # ECDSA P-256: generated in microseconds (RSA takes ~100 ms) and accepted by Go's TLS stack.
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{common_name}-ca")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    # Go ignores the common name for host checks: the SANs are what the API server matches.
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    directory.mkdir(parents=True, exist_ok=True)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Key before certificate: a reader that loads both in between gets a mismatch error and
    # retries, never a certificate whose key is still missing.
    write_atomically(directory / KEY_FILE, key_pem, mode=0o600)
    write_atomically(directory / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    write_atomically(directory / CA_FILE, ca_pem, mode=0o644)
    return ServingCertificate(
        cert_file=directory / CERT_FILE, key_file=directory / KEY_FILE, ca_bundle=ca_pem, ca_file=directory / CA_FILE
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read {path}: {exc.strerror}") from None


def load_serving_certificate(cert_file: Path, key_file: Path, *, ca_file: Path | None = None) -> ServingCertificate:
    """A configured certificate and key, checked to belong together.

    Without ``ca_file`` the certificate must be its own CA (self-signed), and it is the bundle.

    Errors:
        :class:`TlsError` naming the unreadable or mismatched file.
    """
    cert_pem = _read(cert_file)
    key_pem = _read(key_file)
    ca_pem = _read(ca_file) if ca_file is not None else cert_pem
    check_pair(cert_pem, key_pem, cert_file=cert_file, key_file=key_file)
    if ca_file is not None:
        check_bundle(ca_pem, ca_file=ca_file)
    return ServingCertificate(cert_file=cert_file, key_file=key_file, ca_bundle=ca_pem, ca_file=ca_file)


def check_pair(cert_pem: bytes, key_pem: bytes, *, cert_file: Path, key_file: Path) -> x509.Certificate:
    """The (first) certificate of ``cert_pem``, once checked to belong to the key in ``key_pem``. Pure.

    The file names only go into the errors: a file caught half-written parses as no certificate or
    no key, and a certificate and key from two different rotations do not match.

    Errors:
        :class:`TlsError` naming the file that holds no PEM certificate or key, or both files when the
        key belongs to another certificate.
    """
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise TlsError(f"{cert_file} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise TlsError(f"{key_file} holds no unencrypted PEM private key") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        public = cert.public_key().public_bytes(*spki)
    except (ValueError, UnsupportedAlgorithm):
        raise TlsError(f"the certificate in {cert_file} has a public key of an unsupported type") from None
    if key.public_key().public_bytes(*spki) != public:
        raise TlsError(f"the private key in {key_file} does not belong to the certificate in {cert_file}")
    return cert


def check_bundle(ca_pem: bytes, *, ca_file: Path) -> None:
    """Check that ``ca_pem`` holds PEM certificates only (it becomes a ``caBundle`` as it is). Pure.

    Errors:
        :class:`TlsError` naming ``ca_file`` when it holds none, or anything else.
    """
    try:
        x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        raise TlsError(f"{ca_file} holds no PEM certificates") from None


def server_ssl_context(cert: ServingCertificate) -> ssl.SSLContext:
    """A server-side context for ``cert``: TLS 1.2 or newer, no client certificates asked for, no renegotiation.

    Errors:
        :class:`TlsError` naming both files when OpenSSL cannot use them.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The hub drives TLS on a non-blocking socket; a renegotiation asked for by a client would only
    # cost the server work. OpenSSL 3 refuses one by default: said here so that no build changes it.
    context.options |= ssl.OP_NO_RENEGOTIATION
    try:
        context.load_cert_chain(cert.cert_file, cert.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(f"cannot use {cert.cert_file} with {cert.key_file}: {exc}") from None
    return context
