"""Test fleets on the real control plane: edge Nodes (as a kubelet registers them) and their tokens."""

from __future__ import annotations

import functools
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager

import anyio
import msgspec
import structlog

from roles.cloud.transport.auth import token_secret
from roles.kube import Kube, open_kube
from roles.kube.resources import NODES, SECRETS
from schemas.core import EDGE_ROLE_LABEL, Node, NodeCondition, NodeStatus, Secret
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane

TOKEN_NAMESPACE = "kube-system"


@asynccontextmanager
async def admin(cp: ControlPlane) -> AsyncIterator[Kube]:
    """A client with the cluster-admin identity, for set-up."""
    async with open_kube(kubeconfig=str(cp.kubeconfig("admin")), log=structlog.get_logger()) as kube:
        yield kube


async def register_edges(
    cp: ControlPlane,
    names: Iterable[str],
    *,
    namespace: str = TOKEN_NAMESPACE,
    labelled: bool = True,
    extra_labels: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Create Ready edge Nodes and their token Secrets (``labelled`` for hubs to watch); returns each token.

    ``extra_labels`` go on the Nodes and the Secrets alike (to delete them together afterwards).
    """
    tokens: dict[str, str] = {}
    extra = dict(extra_labels or {})
    async with admin(cp) as kube, anyio.create_task_group() as tg:
        for name in names:
            tokens[name] = secrets.token_urlsafe(24)
            secret = token_secret(name, tokens[name], namespace=namespace)
            labels = {**(secret.metadata.labels if labelled else {}), **extra}
            secret = msgspec.structs.replace(secret, metadata=msgspec.structs.replace(secret.metadata, labels=labels))
            tg.start_soon(_register, kube, name, secret, extra)
    return tokens


async def _register(kube: Kube, name: str, secret: Secret, labels: dict[str, str]) -> None:
    # Created with its status, as a kubelet registers a Node: one request instead of two.
    ready = NodeStatus(conditions=(NodeCondition(type="Ready", status="True", reason="Test", message="test"),))
    meta = ObjectMeta(name=name, labels={EDGE_ROLE_LABEL: "", **labels})
    await kube.create(NODES, Node(metadata=meta, status=ready))
    await kube.create(SECRETS, secret, namespace=secret.metadata.namespace)


async def grant_secret_reads(cp: ControlPlane, namespace: str) -> None:
    """Create ``namespace`` and let the hubs ``get`` Secrets in it, as an operator does for another
    tokenNamespace or imageSecretNamespaces entry (``containers/rbac/cloud.yaml``)."""
    role = "nodetaskd:cloud:secret-reads"
    metadata = {"name": role, "namespace": namespace}
    documents = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata,
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "nodetaskd:clouds"}],
        },
    ]
    manifest = {"apiVersion": "v1", "kind": "List", "items": documents}
    await anyio.to_thread.run_sync(
        functools.partial(cp.kubectl, "apply", "-f", "-", input=msgspec.json.encode(manifest).decode())
    )
