"""What a PKCS#10 request or a certificate says, read for the rules of :mod:`flows.certificates.node_requests`.

The hub reads the request an edge sends, the controller the request in a CertificateSigningRequest, the
edge the certificate it is sent: each with these readers, so that all three apply the same rules to the
same facts. Errors say what is wrong with the input (never a parser's traceback).
"""

from __future__ import annotations

from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from flows.certificates.node_requests import RequestFacts, Subject
from nodetask.names import clip

__all__ = ["CsrError", "key_problem", "read_request", "subject_of"]

MIN_RSA_BITS: Final = 2048
EC_CURVES: Final = (ec.SECP256R1, ec.SECP384R1)
"""The curves Go's TLS stack (the API server's) verifies client certificates with; P-521 is left out."""


class CsrError(ValueError):
    """Not a PKCS#10 request that can be read; the message says why."""


def subject_of(name: x509.Name) -> Subject:
    """The parts of a certificate's or request's subject."""
    common_names, organizations, others = [], [], []
    for attribute in name:
        value = attribute.value
        if attribute.oid == NameOID.COMMON_NAME and isinstance(value, str):
            common_names.append(value)
        elif attribute.oid == NameOID.ORGANIZATION_NAME and isinstance(value, str):
            organizations.append(value)
        else:
            others.append(clip(attribute.rfc4514_string(), 160))
    return Subject(common_names=tuple(common_names), organizations=tuple(organizations), others=tuple(others))


def key_problem(key: object) -> str:
    """Why ``key`` (a public key) is not one to certify for a node, or ""."""
    if isinstance(key, ec.EllipticCurvePublicKey):
        if isinstance(key.curve, EC_CURVES):
            return ""
        return f"its key is on curve {key.curve.name}, not P-256 or P-384"
    if isinstance(key, rsa.RSAPublicKey):
        return "" if key.key_size >= MIN_RSA_BITS else f"its RSA key has {key.key_size} bits, fewer than {MIN_RSA_BITS}"
    if isinstance(key, ed25519.Ed25519PublicKey):
        return "its key is Ed25519, which the API server does not take"
    return f"its key is of a kind not taken ({type(key).__name__})"


def read_request(pem: bytes) -> RequestFacts:
    """What the PKCS#10 request ``pem`` asks for, once its signature checks out.

    Errors: :class:`CsrError` when it is no PEM request, or its signature does not verify (it was not made
    with the key it names).
    """
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError:
        raise CsrError("it is not a PKCS#10 request in PEM") from None
    try:
        signed = csr.is_signature_valid
        public_key = csr.public_key()
        subject = subject_of(csr.subject)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise CsrError(f"its key, signature or subject cannot be read: {clip(str(exc))}") from None
    if not signed:
        raise CsrError("its signature does not verify with the key it names")
    try:
        names = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        alt_names: tuple[str, ...] = ()
    except ValueError as exc:
        raise CsrError(f"its extensions cannot be read: {clip(str(exc))}") from None
    else:
        alt_names = tuple(clip(str(name.value), 128) for name in names) or ("an empty list",)
    return RequestFacts(subject=subject, alt_names=alt_names, key_problem=key_problem(public_key))
