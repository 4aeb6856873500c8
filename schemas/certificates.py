"""``certificates.k8s.io/v1`` CertificateSigningRequest, and what nodetaskd's requests for a node's client
certificate carry.

A device's agent makes its key and its PKCS#10 request; its hub creates the CertificateSigningRequest for
it (:mod:`roles.cloud.relay.node_credentials`); the controller approves it
(:mod:`roles.controller.certificates.approver`); kube-controller-manager signs it. Only the fields used are
typed: the approval writes the object back through the ``approval`` subresource, where the API server
takes nothing but the conditions.
"""

from __future__ import annotations

from typing import Final

import msgspec

from schemas.meta import ApiStruct, ObjectMeta

__all__ = [
    "APPROVED",
    "DENIED",
    "FAILED",
    "KUBELET_CLIENT_SIGNER",
    "NODES_GROUP",
    "NODE_LABEL",
    "NODE_USAGES",
    "NODE_USER_PREFIX",
    "CertificateSigningRequest",
    "CertificateSigningRequestCondition",
    "CertificateSigningRequestSpec",
    "CertificateSigningRequestStatus",
    "node_user",
]

API_VERSION: Final = "certificates.k8s.io/v1"
KUBELET_CLIENT_SIGNER: Final = "kubernetes.io/kube-apiserver-client-kubelet"
"""The signer of kubelets' client certificates: kube-controller-manager signs what is approved for it."""
NODE_USER_PREFIX: Final = "system:node:"
NODES_GROUP: Final = "system:nodes"
"""A node's certificate says CN ``system:node:<node>``, O ``system:nodes``: what the Node authorizer knows."""
NODE_USAGES: Final = ("digital signature", "key encipherment", "client auth")
"""The usages of a kubelet's client certificate, exactly (as a kubelet asks for them)."""
NODE_LABEL: Final = "nodetaskd.io/node"
"""On a request a hub created: the node it is for (its session's, authenticated by the node's token)."""

APPROVED: Final = "Approved"
DENIED: Final = "Denied"
FAILED: Final = "Failed"
"""Condition types: approved or denied (the ``approval`` subresource), or failed (the signer could not sign)."""


def node_user(node: str) -> str:
    """The user name a node's certificate carries: ``system:node:<node>``."""
    return f"{NODE_USER_PREFIX}{node}"


class CertificateSigningRequestSpec(ApiStruct, frozen=True):
    request: str = ""
    """The PKCS#10 request in PEM, base64-encoded (the API's ``[]byte``)."""
    signer_name: str = ""
    usages: tuple[str, ...] = ()
    username: str = ""
    """Who created the request: set by the API server, never by the requester."""
    uid: str = ""
    groups: tuple[str, ...] = ()


class CertificateSigningRequestCondition(ApiStruct, frozen=True):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_update_time: str | None = None
    last_transition_time: str | None = None


class CertificateSigningRequestStatus(ApiStruct, frozen=True):
    conditions: tuple[CertificateSigningRequestCondition, ...] = ()
    certificate: str = ""
    """The issued certificate (PEM, base64-encoded), once signed."""


class CertificateSigningRequest(ApiStruct, frozen=True):
    api_version: str = API_VERSION
    kind: str = "CertificateSigningRequest"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: CertificateSigningRequestSpec = msgspec.field(default_factory=CertificateSigningRequestSpec)
    status: CertificateSigningRequestStatus = msgspec.field(default_factory=CertificateSigningRequestStatus)

    def condition(self, kind: str) -> CertificateSigningRequestCondition | None:
        """The condition of type ``kind`` (Approved, Denied, Failed), if the request has one."""
        return next((c for c in self.status.conditions if c.type == kind), None)
