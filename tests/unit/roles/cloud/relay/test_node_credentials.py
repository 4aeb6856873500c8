"""A hub turns its edge's request for the node's certificate into a CertificateSigningRequest for that node only,
and answers with what the signer issued and the CA, or with why there is nothing."""

from __future__ import annotations

import base64

import anyio
import msgspec
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from trio.testing import MockClock

from nodetask.messages import NODE_CREDENTIALS_CAPABILITY, Error, NodeCredentials, NodeCredentialsRequest
from roles.kube.resources import CSRS
from schemas.certificates import (
    DENIED,
    KUBELET_CLIENT_SIGNER,
    NODE_LABEL,
    NODE_USAGES,
    CertificateSigningRequest,
    CertificateSigningRequestCondition,
    CertificateSigningRequestStatus,
)
from tests.unit.roles.cloud.doubles import MemoryApi, edge_nodes, running_hub
from tests.unit.roles.node_pki import Ca, node_name, pem, request

CA = Ca.make()
OFFER = (NODE_CREDENTIALS_CAPABILITY,)
SETTINGS = {"node_ca_bundle": CA.pem.encode(), "node_certificate_timeout": 30.0}


def node_request(node: str, request_id: str = "r1") -> NodeCredentialsRequest:
    return NodeCredentialsRequest(
        id=request_id, csr=pem(request(ec.generate_private_key(ec.SECP256R1()), node_name(node)))
    )


async def created(api: MemoryApi) -> CertificateSigningRequest:
    """The CertificateSigningRequest the hub creates, once it has."""
    while not (found := api.all(CSRS)):  # noqa: ASYNC110 - the fake API server has no event to wait on
        await anyio.sleep(0.05)
    assert len(found) == 1
    return found[0]


def signed(api: MemoryApi, csr: CertificateSigningRequest) -> str:
    """Sign ``csr`` as kube-controller-manager would (once approved): its certificate in its status."""
    asked = x509.load_pem_x509_csr(base64.b64decode(csr.spec.request))
    key = asked.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    certificate = pem(CA.sign(key, asked.subject))
    status = CertificateSigningRequestStatus(certificate=base64.b64encode(certificate.encode()).decode())
    api.put(CSRS, msgspec.structs.replace(csr, status=status))
    return certificate


async def test_a_hub_with_a_ca_offers_node_certificates_and_one_without_does_not() -> None:
    """The Welcome lists node-credentials.v1 only when the hub has a CA bundle to send with the certificates."""
    api = MemoryApi()
    edge_nodes(api, "edge-1")
    async with running_hub(api, **SETTINGS) as (_, door):
        assert NODE_CREDENTIALS_CAPABILITY in (await door.connect("edge-1").hello(capabilities=OFFER)).capabilities
    async with running_hub(api) as (_, door):
        assert NODE_CREDENTIALS_CAPABILITY not in (await door.connect("edge-1").hello(capabilities=OFFER)).capabilities


async def test_the_nodes_request_becomes_a_kubelet_client_csr_and_its_certificate_the_answer() -> None:
    """The hub creates a request for kubelets' client signer with their three usages and the node's label, carrying
    the device's PKCS#10 request unchanged; once signed, the edge gets the certificate and the hub's CA."""
    api = MemoryApi()
    edge_nodes(api, "edge-1")
    async with running_hub(api, **SETTINGS) as (_, door):
        edge = door.connect("edge-1")
        await edge.hello(capabilities=OFFER)
        asked = node_request("edge-1")
        await edge.send(asked)
        csr = await created(api)
        assert csr.spec.signer_name == KUBELET_CLIENT_SIGNER
        assert csr.spec.usages == NODE_USAGES
        assert csr.metadata.labels == {NODE_LABEL: "edge-1"}
        assert base64.b64decode(csr.spec.request).decode() == asked.csr
        certificate = signed(api, csr)
        answer = await edge.next_of(NodeCredentials)
    assert answer == NodeCredentials(id="r1", certificate=certificate, ca_bundle=CA.pem)


async def test_a_request_for_another_nodes_name_is_refused_and_nothing_created() -> None:
    """An edge asking for another node's certificate gets a refusal naming the subject; no request reaches the API."""
    api = MemoryApi()
    edge_nodes(api, "edge-1")
    async with running_hub(api, **SETTINGS) as (_, door):
        edge = door.connect("edge-1")
        await edge.hello(capabilities=OFFER)
        await edge.send(node_request("edge-2"))
        answer = await edge.next_of(NodeCredentials)
    assert "system:node:edge-2" in answer.error
    assert answer.certificate == ""
    assert api.created == []


async def test_a_denied_request_is_answered_with_the_denial() -> None:
    """When the request is denied, the edge is told so, with the denial's reason."""
    api = MemoryApi()
    edge_nodes(api, "edge-1")
    async with running_hub(api, **SETTINGS) as (_, door):
        edge = door.connect("edge-1")
        await edge.hello(capabilities=OFFER)
        await edge.send(node_request("edge-1"))
        csr = await created(api)
        denial = CertificateSigningRequestCondition(type=DENIED, status="True", reason="NodetaskdDenied", message="no")
        api.put(CSRS, msgspec.structs.replace(csr, status=CertificateSigningRequestStatus(conditions=(denial,))))
        answer = await edge.next_of(NodeCredentials)
    assert "denied (NodetaskdDenied: no)" in answer.error


async def test_a_request_never_signed_is_answered_after_the_timeout(autojump_clock: MockClock) -> None:
    """A request nobody approves costs the hub its timeout, then the edge is told it was not signed."""
    api = MemoryApi()
    edge_nodes(api, "edge-1")
    async with running_hub(api, **SETTINGS) as (_, door):
        edge = door.connect("edge-1")
        await edge.hello(capabilities=OFFER)
        await edge.send(node_request("edge-1"))
        answer = await edge.next_of(NodeCredentials)
    assert "was not signed within 30 s" in answer.error


async def test_one_request_per_node_at_a_time() -> None:
    """A second request while the first waits for its signature is refused at once; the first is still answered."""
    api = MemoryApi()
    edge_nodes(api, "edge-1")
    async with running_hub(api, **SETTINGS) as (_, door):
        edge = door.connect("edge-1")
        await edge.hello(capabilities=OFFER)
        await edge.send(node_request("edge-1", "r1"))
        csr = await created(api)
        await edge.send(node_request("edge-1", "r2"))
        busy = await edge.next_of(NodeCredentials)
        signed(api, csr)
        first = await edge.next_of(NodeCredentials)
    assert (busy.id, "under way" in busy.error) == ("r2", True)
    assert (first.id, first.error) == ("r1", "")


async def test_an_edge_that_did_not_list_the_capability_is_told_it_may_not_ask() -> None:
    """Both ends must agree: a request from an edge whose Hello did not list node-credentials.v1 is an error."""
    api = MemoryApi()
    edge_nodes(api, "edge-1")
    async with running_hub(api, **SETTINGS) as (_, door):
        edge = door.connect("edge-1")
        await edge.hello()
        await edge.send(node_request("edge-1"))
        error = await edge.next_of(Error)
    assert error.code == "unexpected"
    assert NODE_CREDENTIALS_CAPABILITY in error.message
    assert api.created == []
