"""What a request for a node's client certificate must say, and whether the controller approves one.

A device's certificate is exactly a kubelet's for its own node: subject CN ``system:node:<node>`` and
O ``system:nodes`` and nothing else, no alternative names, a key of a kind Kubernetes accepts, for the
usages a kubelet asks for. The edge checks what it is sent against it, the hub what it forwards (for its
session's node only), and the controller approves a CertificateSigningRequest by :func:`verdict`.

The controller looks only at requests that are its business (:func:`ours`): pending, for the signer
``kubernetes.io/kube-apiserver-client-kubelet``, created by a hub (``spec.username``, or one of
``spec.groups``, is one the controller is configured with; the API server sets both, the requester
cannot). Anyone else's are left alone: kube-controller-manager's approver handles kubelets' own
bootstrap and renewals. Of its business it approves a request only when all of these hold, and denies
it naming each that does not:

* its label ``nodetaskd.io/node`` names a node ``n``;
* its PKCS#10 request is as above for ``n``;
* its usages are exactly ``digital signature``, ``key encipherment`` and ``client auth``;
* ``n`` has a join token Secret: it is an edge node nodetaskd serves, so no hub gets a certificate for
  another node of the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from nodetask.names import clip, object_name_problem
from schemas.certificates import (
    APPROVED,
    DENIED,
    KUBELET_CLIENT_SIGNER,
    NODE_LABEL,
    NODE_USAGES,
    NODES_GROUP,
    CertificateSigningRequest,
    CertificateSigningRequestSpec,
    node_user,
)

__all__ = [
    "APPROVE_REASON",
    "DENY_REASON",
    "Hubs",
    "RequestFacts",
    "Subject",
    "Verdict",
    "labelled_node",
    "ours",
    "pending",
    "request_problems",
    "subject_problem",
    "verdict",
]

APPROVE_REASON: Final = "NodetaskdApproved"
DENY_REASON: Final = "NodetaskdDenied"


@dataclass(frozen=True, slots=True)
class Subject:
    """A certificate's or a request's subject, as its parts."""

    common_names: tuple[str, ...] = ()
    organizations: tuple[str, ...] = ()
    others: tuple[str, ...] = ()
    """Every other attribute, as ``name=value`` text."""


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What a PKCS#10 request (its signature verified) asks for."""

    subject: Subject
    alt_names: tuple[str, ...] = ()
    """Its subject alternative names of any kind, as text."""
    key_problem: str = ""
    """Why its public key is not one to certify (its kind or size), or empty."""


def _listed(values: Iterable[str]) -> str:
    shown = [repr(clip(v, 128)) for v in values]
    return ", ".join(shown) if shown else "none"


def subject_problem(subject: Subject, node: str) -> str:
    """Why ``subject`` is not exactly node ``node``'s (CN ``system:node:<node>``, O ``system:nodes``), or ""."""
    user = node_user(node)
    problems = []
    if subject.common_names != (user,):
        problems.append(f"its common name is {_listed(subject.common_names)}, not {user!r}")
    if subject.organizations != (NODES_GROUP,):
        problems.append(f"its organization is {_listed(subject.organizations)}, not {NODES_GROUP!r} alone")
    if subject.others:
        problems.append(f"its subject also holds {_listed(subject.others)}")
    return "; ".join(problems)


def request_problems(facts: RequestFacts, node: str) -> list[str]:
    """Why a request that says ``facts`` is not one for node ``node``'s client certificate (empty: it is)."""
    problems = []
    if subject := subject_problem(facts.subject, node):
        problems.append(subject)
    if facts.alt_names:
        problems.append(f"it asks for subject alternative names ({_listed(facts.alt_names)})")
    if facts.key_problem:
        problems.append(facts.key_problem)
    return problems


@dataclass(frozen=True, slots=True)
class Hubs:
    """The identities the hubs act as: a request created by any of them is the controller's business."""

    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    def asked(self, spec: CertificateSigningRequestSpec) -> bool:
        """Whether a hub created the request (its user, or one of its groups, is a hub's)."""
        return spec.username in self.users or any(group in self.groups for group in spec.groups)


def pending(csr: CertificateSigningRequest) -> bool:
    """Whether ``csr`` is neither approved nor denied yet."""
    return csr.condition(APPROVED) is None and csr.condition(DENIED) is None


def ours(csr: CertificateSigningRequest, hubs: Hubs) -> bool:
    """Whether ``csr`` is the controller's to decide: pending, for kubelets' client signer, created by a hub."""
    return csr.spec.signer_name == KUBELET_CLIENT_SIGNER and hubs.asked(csr.spec) and pending(csr)


def labelled_node(csr: CertificateSigningRequest) -> tuple[str, str]:
    """The node ``csr``'s label names and "", or "" and why it names none."""
    value = csr.metadata.labels.get(NODE_LABEL)
    if value is None:
        return "", f"it has no label {NODE_LABEL} naming its node"
    if problem := object_name_problem(value):
        return "", f"its label {NODE_LABEL} {clip(value, 64)!r} is not a node name: it {problem}"
    return value, ""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Approve or deny, and the condition's reason and message."""

    approved: bool
    reason: str
    message: str


def verdict(
    csr: CertificateSigningRequest, request: RequestFacts | str, *, token_found: bool, token_secret: str
) -> Verdict:
    """Approve ``csr`` (one :func:`ours`) or deny it naming what failed.

    ``request`` is what its PKCS#10 request says, or why it could not be read; ``token_found`` whether the
    join token Secret ``token_secret`` (``namespace/name``) of the node its label names exists (looked up
    only when the label names one: pass False otherwise).
    """
    node, problem = labelled_node(csr)
    problems = [problem] if problem else []
    if isinstance(request, str):
        problems.append(f"its request cannot be read: {request}")
    elif node:
        problems += request_problems(request, node)
    if sorted(csr.spec.usages) != sorted(NODE_USAGES):
        problems.append(f"its usages are {_listed(csr.spec.usages)}, not exactly {_listed(NODE_USAGES)}")
    if node and not token_found:
        problems.append(f"node {node} has no join token Secret {token_secret}: it is not an edge node of nodetaskd's")
    if problems:
        return Verdict(approved=False, reason=DENY_REASON, message="nodetaskd denies it: " + "; ".join(problems))
    message = f"nodetaskd approves the client certificate of edge node {node}, asked for by its hub {csr.spec.username}"
    return Verdict(approved=True, reason=APPROVE_REASON, message=message)
