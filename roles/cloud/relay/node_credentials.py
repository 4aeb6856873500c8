"""Devices' node certificates, issued through the cluster's CSR API for the node of each session.

A device's agent makes its key and a PKCS#10 request and sends the request
(:class:`~nodetask.messages.NodeCredentialsRequest`); for an edge listing
:data:`~nodetask.messages.NODE_CREDENTIALS_CAPABILITY` the hub:

1. refuses a request that is not for its session's node (the session's node is the one its token is
   for): its subject must be exactly CN ``system:node:<node>`` and O ``system:nodes``, with no alternative
   names, a key of an accepted kind and a signature that verifies (:mod:`flows.certificates.node_requests`);
   so the hub never asks for a certificate of any other identity;
2. creates a ``certificates.k8s.io/v1`` CertificateSigningRequest for kubelets' client signer with a
   kubelet's three usages, labelled ``nodetaskd.io/node=<node>``;
3. reads it again (with backoff) until it is signed, denied or failed, for at most ``timeout`` seconds,
   and answers with the certificate and the CA bundle the hub's own kubeconfig trusts, or with why not.

The hub never sees the device's key, and its RBAC lets it create and read requests, not approve them:
the controller approves them (:mod:`roles.controller.certificates.approver`), for edge nodes only, and
kube-controller-manager signs. The request is left behind once answered, as a kubelet leaves its own:
kube-controller-manager's cleaner deletes it an hour after it was signed or denied.

A node has one request under way through a hub at a time: another is answered with the reason at once.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from typing import Final, final

import anyio
import structlog

from flows.certificates.node_requests import request_problems
from nodetask.backoff import Backoff
from nodetask.messages import (
    NODE_CREDENTIALS_CAPABILITY,
    NodeCredentials,
    NodeCredentialsRequest,
)
from nodetask.names import MAX_LABEL, clip
from nodetask.relay_messages import MAX_CREDENTIALS_ERROR
from roles.cloud.api import CertificateApi
from roles.cloud.sessions import Session
from roles.common.x509_facts import CsrError, read_request
from roles.kube import ApiError
from roles.kube.resources import CSRS
from schemas.certificates import (
    DENIED,
    FAILED,
    KUBELET_CLIENT_SIGNER,
    NODE_LABEL,
    NODE_USAGES,
    CertificateSigningRequest,
    CertificateSigningRequestSpec,
)
from schemas.meta import ObjectMeta

__all__ = ["NodeCredentialIssuer", "request_name"]

Log = structlog.typing.FilteringBoundLogger

DEFAULT_TIMEOUT: Final = 60.0
NAME_PREFIX: Final = "nodetaskd-"


class _Refused(Exception):
    """No certificate for this request; the message says why (the edge is told it)."""


def request_name(node: str) -> str:
    """A new CertificateSigningRequest's name for ``node``: the node's name and a random part."""
    return f"{NAME_PREFIX}{node}-{secrets.token_hex(4)}"


@final
class NodeCredentialIssuer:
    """Issues node certificates for the hub's sessions (:meth:`issue`); off when ``ca_bundle`` is None."""

    def __init__(
        self,
        kube: CertificateApi,
        *,
        ca_bundle: bytes | None,
        timeout: float = DEFAULT_TIMEOUT,
        on_outcome: Callable[[str], object] = lambda _: None,
    ) -> None:
        """``ca_bundle`` is the PEM the hub's kubeconfig verifies the API server with (sent with each
        certificate, for the device to do the same); ``on_outcome`` counts each request's outcome."""
        self._kube = kube
        self._ca_bundle = ca_bundle.decode("ascii") if ca_bundle is not None else None
        self._timeout = timeout
        self._on_outcome = on_outcome
        self._under_way: set[str] = set()
        """Nodes with a request under way."""

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What the hub lists in its Welcome for node certificates."""
        return (NODE_CREDENTIALS_CAPABILITY,) if self._ca_bundle is not None else ()

    def offered(self, session: Session) -> bool:
        """Whether ``session``'s edge may ask: this hub issues and the edge listed the capability."""
        return self._ca_bundle is not None and NODE_CREDENTIALS_CAPABILITY in session.capabilities

    async def issue(self, session: Session, msg: NodeCredentialsRequest, log: Log) -> None:
        """Answer ``msg`` with the node's certificate or why there is none (run it as a task of the session)."""
        node = session.node
        if node in self._under_way:
            self._on_outcome("busy")
            text = "a request for this node's certificate is under way already"
            await session.send(NodeCredentials(id=msg.id, error=text), own=True)
            return
        self._under_way.add(node)
        try:
            certificate = await self._issue(node, msg, log)
        except _Refused as exc:
            log.warning("node_certificate_refused", error=str(exc))
            self._on_outcome("refused")
            answer = NodeCredentials(id=msg.id, error=clip(str(exc), MAX_CREDENTIALS_ERROR - 32))
        else:
            self._on_outcome("issued")
            answer = NodeCredentials(id=msg.id, certificate=certificate, ca_bundle=self._ca_bundle or "")
        finally:
            self._under_way.discard(node)
        await session.send(answer, own=True)

    async def _issue(self, node: str, msg: NodeCredentialsRequest, log: Log) -> str:
        """The signed certificate (PEM) for ``msg``. Errors: :class:`_Refused` saying why there is none."""
        pem = msg.csr.encode("utf-8")
        try:
            facts = read_request(pem)
        except CsrError as exc:
            raise _Refused(f"the request is refused: {exc}") from None
        if problems := request_problems(facts, node):
            said = "; ".join(problems)
            raise _Refused(f"the request is refused: it is not for node {node}'s client certificate: {said}")
        if len(node) > MAX_LABEL:
            raise _Refused(f"node {node}'s name is longer than a label value ({MAX_LABEL} characters) may be")
        csr = CertificateSigningRequest(
            metadata=ObjectMeta(name=request_name(node), labels={NODE_LABEL: node}),
            spec=CertificateSigningRequestSpec(
                request=base64.b64encode(pem).decode("ascii"), signer_name=KUBELET_CLIENT_SIGNER, usages=NODE_USAGES
            ),
        )
        name = csr.metadata.name
        try:
            await self._kube.create(CSRS, csr)
        except ApiError as exc:
            raise _Refused(f"the hub cannot create the CertificateSigningRequest: {exc}") from None
        log.info("node_certificate_requested", csr=name)
        with anyio.move_on_after(self._timeout):
            certificate = await self._signed(name)
            log.info("node_certificate_issued", csr=name)
            return certificate
        raise _Refused(f"CertificateSigningRequest {name} was not signed within {self._timeout:g} s (is it approved?)")

    async def _signed(self, name: str) -> str:
        backoff = Backoff(initial=0.25, cap=5.0)
        while True:
            await anyio.sleep(backoff.delay())
            try:
                csr = await self._kube.get(CSRS, name)
            except ApiError as exc:
                if exc.status in (403, 404):
                    raise _Refused(f"the hub cannot read CertificateSigningRequest {name}: {exc}") from None
                continue  # the API server is away: read again
            for kind in (DENIED, FAILED):
                if (condition := csr.condition(kind)) is not None:
                    said = clip(f"{condition.reason}: {condition.message}", 512)
                    raise _Refused(f"CertificateSigningRequest {name} is {kind.lower()} ({said})")
            if csr.status.certificate:
                try:
                    return base64.b64decode(csr.status.certificate, validate=True).decode("ascii")
                except (ValueError, UnicodeDecodeError):
                    raise _Refused(f"CertificateSigningRequest {name} holds a certificate that is no PEM") from None
