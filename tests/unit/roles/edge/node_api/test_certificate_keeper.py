"""The agent keeps its node's certificate issued through a hub that offers it: it asks with its own key, keeps a good
answer, refuses a bad one, and retries failures with backoff, saying each new reason once."""

from __future__ import annotations

from pathlib import Path

import anyio
import structlog
import trio.testing
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from structlog.testing import capture_logs
from trio.testing import MockClock

from nodetask.messages import NODE_CREDENTIALS_CAPABILITY, NodeCredentials, NodeCredentialsRequest
from roles.edge.node_api.certificate_keeper import CertificateKeeper
from roles.edge.node_api.credentials import CA_FILE, CERT_FILE, KEY_FILE
from tests.unit.roles.edge.doubles import NODE, HubSession, running_edge
from tests.unit.roles.node_pki import NOW, Ca, node_name, pem

OFFER = (NODE_CREDENTIALS_CAPABILITY,)


def keeper(directory: Path, **kwargs: float) -> CertificateKeeper:
    return CertificateKeeper(directory, NODE, log=structlog.get_logger(), now=lambda: NOW, **kwargs)


async def request_of(session: HubSession) -> NodeCredentialsRequest:
    msg = await session.receive()
    assert isinstance(msg, NodeCredentialsRequest), msg
    return msg


def signed(ca: Ca, request: NodeCredentialsRequest, subject: x509.Name | None = None) -> str:
    csr = x509.load_pem_x509_csr(request.csr.encode())
    key = csr.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return pem(ca.sign(key, subject or csr.subject))


async def test_a_missing_certificate_is_asked_for_and_the_answer_kept(tmp_path: Path, clock: MockClock) -> None:
    """With a hub offering node-credentials.v1, the agent lists it, sends a request for its node with its key,
    and writes the signed certificate and the CA once they check out."""
    directory = tmp_path / "node-credentials"
    certificates = keeper(directory)
    ca = Ca.make()
    async with running_edge(tmp_path, capabilities=OFFER, certificates=certificates) as edge:
        session = await edge.hub.accept()
        assert NODE_CREDENTIALS_CAPABILITY in edge.hub.hellos[0].capabilities
        request = await request_of(session)
        csr = x509.load_pem_x509_csr(request.csr.encode())
        assert csr.subject == node_name(NODE)
        certificate = signed(ca, request)
        await session.send(NodeCredentials(id=request.id, certificate=certificate, ca_bundle=ca.pem))
        while certificates.issued == 0:  # noqa: ASYNC110 - a counter of the keeper's, no event to wait on
            await anyio.sleep(1)
    assert (directory / CERT_FILE).read_text() == certificate
    assert (directory / CA_FILE).read_text() == ca.pem
    assert x509.load_pem_x509_certificate(certificate.encode()).public_key() == csr.public_key()
    assert (directory / KEY_FILE).is_file()


async def test_a_hub_that_does_not_offer_it_is_never_asked(tmp_path: Path, clock: MockClock) -> None:
    """Without the capability in the Welcome, no request goes out (an older hub would refuse the frame)."""
    async with running_edge(tmp_path, certificates=keeper(tmp_path / "creds")) as edge:
        session = await edge.hub.accept()
        await anyio.sleep(30)
        assert session.nothing_received()


async def test_a_held_certificate_is_not_asked_for_again_until_it_is_due(tmp_path: Path, clock: MockClock) -> None:
    """Once a certificate is kept, the next session sends no request (it is far from two thirds of its life)."""
    directory = tmp_path / "creds"
    certificates = keeper(directory)
    ca = Ca.make()
    async with running_edge(tmp_path, capabilities=OFFER, certificates=certificates) as edge:
        session = await edge.hub.accept()
        request = await request_of(session)
        await session.send(NodeCredentials(id=request.id, certificate=signed(ca, request), ca_bundle=ca.pem))
        while certificates.issued == 0:  # noqa: ASYNC110 - a counter of the keeper's, no event to wait on
            await anyio.sleep(1)
        await session.link.close()
        again = await edge.hub.accept()
        await anyio.sleep(30)
        assert again.nothing_received()


async def test_failures_are_retried_with_backoff_and_each_reason_logged_once(tmp_path: Path, clock: MockClock) -> None:
    """A refusal, then the same refusal, then a bad certificate: three requests, spaced by growing waits, and
    two warnings (one per reason); the bad certificate is not written."""
    directory = tmp_path / "creds"
    ca = Ca.make()
    with capture_logs() as logs:
        certificates = keeper(directory, first_retry=10.0)
        async with running_edge(tmp_path, capabilities=OFFER, certificates=certificates) as edge:
            session = await edge.hub.accept()
            times = []
            for _ in range(2):
                request = await request_of(session)
                times.append(anyio.current_time())
                await session.send(NodeCredentials(id=request.id, error="CertificateSigningRequest x is denied"))
            request = await request_of(session)
            times.append(anyio.current_time())
            await session.send(
                NodeCredentials(id=request.id, certificate=signed(ca, request, node_name("edge-2")), ca_bundle=ca.pem)
            )
            await trio.testing.wait_all_tasks_blocked()
            await anyio.sleep(1)
    failures = [e for e in logs if e["event"] == "node_certificate_failed"]
    assert [("denied" in e["error"], "not node" in e["error"]) for e in failures] == [(True, False), (False, True)]
    assert times[1] - times[0] >= 5.0  # at least half of the first backoff
    assert times[2] - times[1] >= 10.0  # the second is twice as long, at least half of it
    assert not (directory / CERT_FILE).exists()


async def test_an_unanswered_request_is_given_up_and_asked_again(tmp_path: Path, clock: MockClock) -> None:
    """A hub that never answers costs the agent one answer timeout, then a new request after the backoff."""
    certificates = keeper(tmp_path / "creds", answer_timeout=30.0, first_retry=10.0)
    async with running_edge(tmp_path, capabilities=OFFER, certificates=certificates) as edge:
        session = await edge.hub.accept()
        first = await request_of(session)
        second = await request_of(session)
        assert first.id != second.id
        assert first.csr != ""
        assert second.csr != ""
