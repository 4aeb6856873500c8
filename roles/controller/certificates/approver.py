"""The controller's approver of devices' node certificates.

CertificateSigningRequests are watched; those the controller is to decide
(:func:`flows.certificates.node_requests.ours`: pending, for kubelets' client signer, created by a hub) are
kept and each given a worker, which looks for the join token Secret of the node the request's label names
(its metadata only: the token is never read), reads the PKCS#10 request
(:func:`roles.common.x509_facts.read_request`), and writes the verdict
(:func:`flows.certificates.node_requests.verdict`) as the Approved or Denied condition through the
``approval`` subresource, conditional on the request's resourceVersion (a 409: the newer copy's event
decides again). Anyone else's requests are not looked at: kube-controller-manager's approver handles
kubelets' own bootstrap and renewals. An error reading the Secret (but its absence) leaves the request
pending and is tried again with backoff: a request is never denied for what the API server could not say.
"""

from __future__ import annotations

import base64
import binascii

import anyio
import anyio.abc
import msgspec
import structlog

from flows.certificates.node_requests import Hubs, RequestFacts, labelled_node, ours, verdict
from nodetask.names import clip
from roles.common.edge_tokens import token_secret_name
from roles.common.x509_facts import CsrError, read_request
from roles.controller.keyed import KeyedWorkers
from roles.controller.watches import Watch, follow
from roles.kube import Conflict, Deleted, Invalid, Kube, NotFound, Relisted, Upserted, WatchEvent
from roles.kube.resources import CSRS, SECRET_HEADS
from roles.kube.versions import fresher
from schemas.certificates import APPROVED, DENIED, CertificateSigningRequest, CertificateSigningRequestCondition

__all__ = ["CertificateApprover", "request_of"]

Log = structlog.typing.FilteringBoundLogger


def request_of(csr: CertificateSigningRequest) -> RequestFacts | str:
    """What ``csr``'s PKCS#10 request asks for, or why it cannot be read."""
    try:
        pem = base64.b64decode(csr.spec.request, validate=True)
    except (binascii.Error, ValueError):
        return "spec.request is not base64"
    try:
        return read_request(pem)
    except CsrError as exc:
        return str(exc)


class CertificateApprover:
    """Approves the node certificates the hubs ask for, or denies them. Run :meth:`run` in a task group."""

    def __init__(self, *, kube: Kube, hubs: Hubs, token_namespace: str, log: Log) -> None:
        self._kube = kube
        self._hubs = hubs
        self._namespace = token_namespace
        self._log = log.bind(controller="certificates")
        self._pending: dict[str, CertificateSigningRequest] = {}
        """The requests to decide, by name."""
        self._ready = anyio.Event()
        self._workers: KeyedWorkers[str]
        self.approved = 0
        self.denied = 0

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch and decide until cancelled; ready once the watch's first list has been taken in."""
        async with anyio.create_task_group() as tg:
            self._workers = KeyedWorkers(tg, self._pass, ready=self._ready, log=self._log, what="certificate request")
            await follow(tg, self._kube, (Watch(CSRS, self._on_request),), on_invalid=self._log_invalid)
            self._ready.set()
            task_status.started()

    async def _log_invalid(self, kind: str, event: Invalid) -> None:
        self._log.warning("undecodable_object", kind=kind, name=event.name, error=clip(event.error))

    def _on_request(self, event: WatchEvent) -> None:
        match event:
            case Relisted(objects=objects):
                self._pending = {}
                for csr in objects:
                    self._keep(csr)
            case Upserted(obj=csr):
                self._keep(csr)
            case Deleted(obj=csr):
                self._pending.pop(csr.metadata.name, None)

    def _keep(self, csr: CertificateSigningRequest) -> None:
        name = csr.metadata.name
        cached = self._pending.get(name)
        if cached is not None and not fresher(csr.metadata.resource_version, cached.metadata.resource_version):
            return
        if ours(csr, self._hubs):
            self._pending[name] = csr
            self._workers.poke(name)
        else:
            self._pending.pop(name, None)

    async def _pass(self, name: str) -> float | None:
        csr = self._pending.get(name)
        if csr is None or not ours(csr, self._hubs):
            return None
        node, _ = labelled_node(csr)
        secret = token_secret_name(node) if node else ""
        found = False
        if node:
            try:
                await self._kube.get(SECRET_HEADS, secret, namespace=self._namespace)
                found = True
            except NotFound:
                pass
        decided = verdict(csr, request_of(csr), token_found=found, token_secret=f"{self._namespace}/{secret}")
        condition = CertificateSigningRequestCondition(
            type=APPROVED if decided.approved else DENIED,
            status="True",
            reason=decided.reason,
            message=decided.message,
        )
        status = msgspec.structs.replace(csr.status, conditions=(*csr.status.conditions, condition))
        decision = msgspec.structs.replace(csr, status=status)
        try:
            written = await self._kube.replace(CSRS, decision, subresource="approval")
        except Conflict:
            return None  # changed meanwhile: the newer copy's event decides again
        self._keep(written)
        log = self._log.bind(csr=name, node=node, requester=csr.spec.username)
        if decided.approved:
            self.approved += 1
            log.info("node_certificate_approved")
        else:
            self.denied += 1
            log.warning("node_certificate_denied", reason=decided.message)
        return None
