"""A cluster CA in memory for the node-certificate tests: requests made as a device makes them (or not quite),
and certificates signed as kube-controller-manager signs them (or not quite)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def pem(obj: x509.Certificate | x509.CertificateSigningRequest) -> str:
    return obj.public_bytes(serialization.Encoding.PEM).decode("ascii")


def name(common_names: Sequence[str] = (), organizations: Sequence[str] = (), units: Sequence[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes += [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, u) for u in units]
    attributes += [x509.NameAttribute(NameOID.COMMON_NAME, cn) for cn in common_names]
    return x509.Name(attributes)


def node_name(node: str) -> x509.Name:
    return name([f"system:node:{node}"], ["system:nodes"])


def request(
    key: ec.EllipticCurvePrivateKey, subject: x509.Name, *, dns_names: Sequence[str] = ()
) -> x509.CertificateSigningRequest:
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    if dns_names:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), False)
    return builder.sign(key, hashes.SHA256())


@dataclass
class Ca:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def make(cls, common_name: str = "test-cluster-ca") -> Ca:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = name([common_name])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - timedelta(days=1))
            .not_valid_after(NOW + timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @property
    def pem(self) -> str:
        return pem(self.cert)

    def sign(
        self,
        public_key: ec.EllipticCurvePublicKey,
        subject: x509.Name,
        *,
        start: datetime = NOW - timedelta(minutes=1),
        days: float = 365,
        usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.CLIENT_AUTH,
    ) -> x509.Certificate:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + timedelta(days=days))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self.key, hashes.SHA256())
        )

    def intermediate(self) -> Ca:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(["test-intermediate"]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - timedelta(days=1))
            .not_valid_after(NOW + timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        return Ca(key, cert)
