"""The device's side of its node certificate: when one is due, its one key, and what it keeps of the hub's answer
(only the node's certificate for its own key, from the CA it came with, valid now; nothing else is written)."""

from __future__ import annotations

import stat
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from roles.edge.node_api.credentials import CA_FILE, CERT_FILE, KEY_FILE
from roles.edge.node_api.node_certificate import IssuedError, NodeKey, accept, due, node_key, request_pem
from tests.unit.roles.node_pki import NOW, Ca, name, node_name, pem

NODE = "edge-1"


def issued(
    ca: Ca,
    key: NodeKey,
    subject: x509.Name | None = None,
    *,
    start: datetime = NOW - timedelta(minutes=1),
    days: float = 365,
    usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.CLIENT_AUTH,
) -> str:
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return pem(ca.sign(key.public_key(), subject or node_name(NODE), start=start, days=days, usage=usage))


def keep(directory: Path, key: NodeKey, certificate: str, ca_bundle: str) -> object:
    return accept(directory, NODE, key, certificate=certificate, ca_bundle=ca_bundle, now=NOW)


def test_the_key_is_made_once_private_and_kept(tmp_path: Path) -> None:
    """The first call makes an EC P-256 key (0600, in a 0700 directory); later calls return the same key."""
    directory = tmp_path / "node-credentials"
    key, made = node_key(directory)
    again, made_again = node_key(directory)
    assert made
    assert not made_again
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert isinstance(key.curve, ec.SECP256R1)
    assert key.private_numbers() == again.private_numbers()
    assert stat.S_IMODE((directory / KEY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_the_request_is_for_the_node_and_signed_with_its_key(tmp_path: Path) -> None:
    """The PKCS#10 request names CN system:node:<node>, O system:nodes, and carries the device's public key."""
    key, _ = node_key(tmp_path)
    csr = x509.load_pem_x509_csr(request_pem(key, NODE).encode())
    assert csr.is_signature_valid
    assert csr.subject == node_name(NODE)
    assert csr.public_key() == key.public_key()


def test_a_certificate_is_due_when_missing_foreign_or_two_thirds_through(tmp_path: Path) -> None:
    """Due without node.crt, for another node's certificate, for one past two thirds of its life; not before."""
    ca = Ca.make()
    key, _ = node_key(tmp_path)
    assert "missing" in due(tmp_path, NODE, NOW).reason
    (tmp_path / CERT_FILE).write_text(issued(ca, key, node_name("edge-2")))
    assert "not node edge-1's" in due(tmp_path, NODE, NOW).reason
    (tmp_path / CERT_FILE).write_text(issued(ca, key, start=NOW, days=30))
    fresh = due(tmp_path, NODE, NOW + timedelta(days=19))
    assert fresh.reason == ""
    assert fresh.renew_at == NOW + timedelta(days=20)
    assert "two thirds" in due(tmp_path, NODE, NOW + timedelta(days=20)).reason


def test_a_certificate_without_its_key_is_due(tmp_path: Path) -> None:
    """A certificate for another key than node.key's (e.g. node.key replaced) is as good as none."""
    ca = Ca.make()
    node_key(tmp_path)
    (tmp_path / CERT_FILE).write_text(issued(ca, ec.generate_private_key(ec.SECP256R1())))
    assert "is not the key of" in due(tmp_path, NODE, NOW).reason


def test_the_hubs_answer_is_kept_when_it_checks_out(tmp_path: Path) -> None:
    """A certificate for the node's key and subject, issued by the CA sent along: ca.crt and node.crt written."""
    ca = Ca.make()
    key, _ = node_key(tmp_path)
    certificate = issued(ca, key)
    keep(tmp_path, key, certificate, ca.pem)
    assert (tmp_path / CERT_FILE).read_text() == certificate
    assert (tmp_path / CA_FILE).read_text() == ca.pem
    assert due(tmp_path, NODE, NOW).reason == ""


def test_a_certificate_through_an_intermediate_is_kept(tmp_path: Path) -> None:
    """A signer's chain (the leaf, then its intermediate) up to the CA bundle is a certificate from that CA."""
    root = Ca.make()
    middle = root.intermediate()
    key, _ = node_key(tmp_path)
    keep(tmp_path, key, issued(middle, key) + pem(middle.cert), root.pem)
    assert (tmp_path / CERT_FILE).is_file()


def _other_ca_bundle(ca: Ca, key: NodeKey) -> tuple[str, str]:
    return issued(ca, key), Ca.make().pem


def _another_key(ca: Ca, key: NodeKey) -> tuple[str, str]:
    return issued(ca, ec.generate_private_key(ec.SECP256R1())), ca.pem


def _another_node(ca: Ca, key: NodeKey) -> tuple[str, str]:
    return issued(ca, key, node_name("edge-2")), ca.pem


def _masters_group(ca: Ca, key: NodeKey) -> tuple[str, str]:
    return issued(ca, key, name(["system:node:edge-1"], ["system:nodes", "system:masters"])), ca.pem


def _expired(ca: Ca, key: NodeKey) -> tuple[str, str]:
    return issued(ca, key, start=NOW - timedelta(days=40), days=30), ca.pem


def _server_only(ca: Ca, key: NodeKey) -> tuple[str, str]:
    return issued(ca, key, usage=ExtendedKeyUsageOID.SERVER_AUTH), ca.pem


def _garbage(ca: Ca, key: NodeKey) -> tuple[str, str]:
    return "not a certificate", ca.pem


def _no_ca(ca: Ca, key: NodeKey) -> tuple[str, str]:
    return issued(ca, key), "not a CA"


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (_other_ca_bundle, "not issued by the CA it came with"),
        (_another_key, "not for this device's key"),
        (_another_node, "not node edge-1's"),
        (_masters_group, "not 'system:nodes' alone"),
        (_expired, "not valid now"),
        (_server_only, "not for client authentication"),
        (_garbage, "certificate holds no PEM"),
        (_no_ca, "CA bundle holds no PEM"),
    ],
)
def test_a_bad_answer_is_refused_clearly_and_nothing_is_written(
    tmp_path: Path, answer: Callable[[Ca, NodeKey], tuple[str, str]], says: str
) -> None:
    """Whatever is wrong with the hub's answer is named, and neither node.crt nor ca.crt is touched."""
    ca = Ca.make()
    key, _ = node_key(tmp_path)
    (tmp_path / CA_FILE).write_text("old ca")
    certificate, bundle = answer(ca, key)
    with pytest.raises(IssuedError, match=says):
        keep(tmp_path, key, certificate, bundle)
    assert not (tmp_path / CERT_FILE).exists()
    assert (tmp_path / CA_FILE).read_text() == "old ca"


def test_an_answer_for_a_key_replaced_meanwhile_is_refused(tmp_path: Path) -> None:
    """If node.key changed while the request was out, the certificate for the old key is not written beside it."""
    ca = Ca.make()
    key, _ = node_key(tmp_path)
    (tmp_path / KEY_FILE).unlink()
    node_key(tmp_path)
    with pytest.raises(IssuedError, match="changed while"):
        keep(tmp_path, key, issued(ca, key), ca.pem)
    assert not (tmp_path / CERT_FILE).exists()
