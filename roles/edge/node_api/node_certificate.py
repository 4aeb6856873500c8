"""The node's key and certificate on the device: whether a new certificate is due, the request for one, and the
checks of what the hub sends back. Blocking (files, key generation): the keeper runs these in a thread.

The key ``node.key`` is made once (EC P-256), kept (0600) and reused for every renewal: it never leaves the
device, and the certificate it has stays usable until the new one is written. A certificate is due when
``node.crt`` is missing, cannot be read, is not ``system:node:<node>``'s, does not belong to the key, or is
past two thirds of its lifetime (as a kubelet renews its own). What the hub sends is written only once it is
the node's certificate for this key, issued by the CA it comes with, and valid now: ``ca.crt`` first, then
``node.crt``, each atomically, so that the endpoint (:mod:`roles.edge.node_api.credentials`) reads either the
old pair or the new one.

Loaded only when ``nodeApi`` is on: an agent without it carries no ``cryptography``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from flows.certificates.node_requests import subject_problem
from roles.common.files import write_atomically
from roles.common.x509_facts import key_problem, subject_of
from roles.edge.node_api.credentials import CA_FILE, CERT_FILE, KEY_FILE
from schemas.certificates import NODES_GROUP, node_user

__all__ = ["Due", "IssuedError", "NodeKey", "accept", "due", "node_key", "request_pem"]

RENEW_AFTER: Final = 2 / 3
"""Of a certificate's lifetime, what passes before a new one is asked for."""
CLOCK_SKEW: Final = timedelta(minutes=5)
"""How far a certificate's start may lie ahead of the device's clock and still be taken."""

NodeKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
_SPKI: Final = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class IssuedError(ValueError):
    """What the hub sent cannot be kept as the node's credentials; the message says why."""


@dataclass(frozen=True, slots=True)
class Due:
    """Why a new certificate is needed (empty: the one held is good until ``renew_at``)."""

    reason: str
    renew_at: datetime | None = None


def _renew_at(cert: x509.Certificate) -> datetime:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * RENEW_AFTER


def _load_key(path: Path) -> NodeKey:
    """The private key in ``path``. Errors: OSError when it cannot be read, ValueError when it is no usable key."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (TypeError, UnsupportedAlgorithm):
        raise ValueError(f"{path} holds no unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an EC or RSA key")
    if problem := key_problem(key.public_key()):
        raise ValueError(f"{path}: {problem}")
    return key


class _NotHeld(Exception):
    """The node holds no certificate that can be used; the message says why."""


def _held(directory: Path, node: str) -> x509.Certificate:
    """The node's certificate in ``directory``, once it is the node's and its key is there.

    Errors: :class:`_NotHeld` saying what is missing or wrong."""
    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except FileNotFoundError:
        raise _NotHeld(f"{cert_path} is missing") from None
    except (OSError, ValueError) as exc:
        raise _NotHeld(f"{cert_path} cannot be read: {exc}") from None
    if problem := subject_problem(subject_of(cert.subject), node):
        raise _NotHeld(f"{cert_path} is not node {node}'s: {problem}")
    try:
        key = _load_key(key_path)
    except FileNotFoundError:
        raise _NotHeld(f"{key_path} is missing") from None
    except (OSError, ValueError) as exc:
        raise _NotHeld(f"{key_path} cannot be used: {exc}") from None
    if key.public_key().public_bytes(*_SPKI) != cert.public_key().public_bytes(*_SPKI):
        raise _NotHeld(f"{key_path} is not the key of {cert_path}")
    return cert


def due(directory: Path, node: str, now: datetime) -> Due:
    """Whether the node's certificate in ``directory`` must be (re)issued, and why."""
    try:
        cert = _held(directory, node)
    except _NotHeld as exc:
        return Due(str(exc))
    renew_at = _renew_at(cert)
    if now >= renew_at:
        ends = _stamp(cert.not_valid_after_utc)
        return Due(f"{directory / CERT_FILE} is past two thirds of its lifetime (it ends {ends})")
    return Due("", renew_at)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def node_key(directory: Path) -> tuple[NodeKey, bool]:
    """The node's key in ``directory``, made (EC P-256, 0600) when there is none that can be used; and whether
    it was made now. The directory is made 0700 when missing."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / KEY_FILE
    try:
        return _load_key(path), False
    except (OSError, ValueError):
        pass
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_atomically(path, pem, mode=0o600)
    return key, True


def request_pem(key: NodeKey, node: str) -> str:
    """A PKCS#10 request, signed with ``key``, for CN ``system:node:<node>`` and O ``system:nodes``."""
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, NODES_GROUP),
            x509.NameAttribute(NameOID.COMMON_NAME, node_user(node)),
        ]
    )
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


def _certificates(pem: str, what: str) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise IssuedError(f"the {what} holds no PEM certificates") from None


def _issued_by(cert: x509.Certificate, issuers: list[x509.Certificate]) -> bool:
    for issuer in issuers:
        try:
            cert.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
            continue
        return True
    return False


def _check(certificate: str, ca_bundle: str, key: NodeKey, node: str, now: datetime) -> x509.Certificate:
    chain = _certificates(certificate, "certificate")
    cas = _certificates(ca_bundle, "CA bundle")
    leaf = chain[0]
    if leaf.public_key().public_bytes(*_SPKI) != key.public_key().public_bytes(*_SPKI):
        raise IssuedError("the certificate is not for this device's key")
    if problem := subject_problem(subject_of(leaf.subject), node):
        raise IssuedError(f"the certificate is not node {node}'s: {problem}")
    try:
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = None
    except ValueError as exc:
        raise IssuedError(f"the certificate's extensions cannot be read: {exc}") from None
    if usages is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        raise IssuedError("the certificate is not for client authentication")
    if not (leaf.not_valid_before_utc - CLOCK_SKEW <= now < leaf.not_valid_after_utc):
        start, end = _stamp(leaf.not_valid_before_utc), _stamp(leaf.not_valid_after_utc)
        raise IssuedError(f"the certificate is not valid now (from {start} to {end})")
    # Up the chain it came with (any intermediates) to a certificate of the CA bundle.
    signed, rest = leaf, chain[1:]
    while not _issued_by(signed, cas):
        parent = next((c for c in rest if _issued_by(signed, [c])), None)
        if parent is None:
            raise IssuedError("the certificate is not issued by the CA it came with")
        rest.remove(parent)
        signed = parent
    return leaf


def accept(directory: Path, node: str, key: NodeKey, *, certificate: str, ca_bundle: str, now: datetime) -> datetime:
    """Check what the hub sent and keep it (``ca.crt``, then ``node.crt``); when the new certificate is due.

    Errors: :class:`IssuedError` naming what is wrong (nothing is written then); OSError when it cannot be written.
    """
    leaf = _check(certificate, ca_bundle, key, node, now)
    try:
        on_disk = _load_key(directory / KEY_FILE).public_key().public_bytes(*_SPKI)
    except (OSError, ValueError):
        on_disk = b""
    if on_disk != key.public_key().public_bytes(*_SPKI):
        raise IssuedError(f"{directory / KEY_FILE} changed while the certificate was asked for")
    write_atomically(directory / CA_FILE, ca_bundle.encode("ascii"), mode=0o644)
    write_atomically(directory / CERT_FILE, certificate.encode("ascii"), mode=0o644)
    return _renew_at(leaf)
