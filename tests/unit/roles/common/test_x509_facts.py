"""A PKCS#10 request is read into what it asks for only when its signature holds; anything else says what it is."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from roles.common.x509_facts import CsrError, key_problem, read_request
from tests.unit.roles.node_pki import name, node_name, pem, request

BEGIN = "-----BEGIN CERTIFICATE REQUEST-----"
END = "-----END CERTIFICATE REQUEST-----"


def test_a_devices_request_reads_as_the_nodes_subject_and_nothing_else() -> None:
    """A request made as the agent makes it: its CN and O, no other attribute, no alternative name, a good key."""
    facts = read_request(pem(request(ec.generate_private_key(ec.SECP256R1()), node_name("edge-1"))).encode())
    assert facts.subject.common_names == ("system:node:edge-1",)
    assert facts.subject.organizations == ("system:nodes",)
    assert facts.subject.others == ()
    assert facts.alt_names == ()
    assert facts.key_problem == ""


def test_other_attributes_and_alternative_names_are_reported() -> None:
    """An OU in the subject and a DNS name asked for both show in the facts (the rules then refuse them)."""
    subject = name(["system:node:edge-1"], ["system:nodes"], ["ops"])
    facts = read_request(pem(request(ec.generate_private_key(ec.SECP256R1()), subject, dns_names=["x"])).encode())
    assert facts.subject.others == ("OU=ops",)
    assert facts.alt_names == ("x",)


def test_a_request_whose_signature_does_not_verify_is_refused() -> None:
    """A request whose subject was changed after it was signed (edge-1 made edge-2) is no request of its key."""
    text = pem(request(ec.generate_private_key(ec.SECP256R1()), node_name("edge-1")))
    der = base64.b64decode("".join(text.splitlines()[1:-1])).replace(b"edge-1", b"edge-2")
    tampered = (
        f"-----BEGIN CERTIFICATE REQUEST-----\n{base64.b64encode(der).decode()}\n-----END CERTIFICATE REQUEST-----\n"
    )
    with pytest.raises(CsrError, match="signature does not verify"):
        read_request(tampered.encode())


@pytest.mark.parametrize(
    "text", [b"", b"hello", b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"]
)
def test_what_is_no_request_is_refused_saying_so(text: bytes) -> None:
    """Garbage is refused with a CsrError, never a parser's exception."""
    with pytest.raises(CsrError):
        read_request(text)


def test_weak_and_unusual_keys_are_named() -> None:
    """A short RSA key and a P-521 key are keys the node's certificate may not have; P-256 and RSA 2048 may."""
    assert key_problem(ec.generate_private_key(ec.SECP256R1()).public_key()) == ""
    assert "P-256" in key_problem(ec.generate_private_key(ec.SECP521R1()).public_key())
    short = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    assert "1024 bits" in key_problem(short)
