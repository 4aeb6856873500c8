"""The benchmark's control plane and its fleet of edge Nodes, with their tokens.

The runner starts a private kube-apiserver + etcd (``tools/provision/controlplane.py``) or attaches to one
already running (``--cluster-dir``), applies RBAC and the CRDs, and registers a fleet: Ready edge
Nodes ``bench-00000``... and one token Secret per node. Tokens are derived from a seed (an HMAC of
the node name), so that a separate fleet process can compute every token from the seed alone.

Registration is idempotent (an existing Node gets its labels patched) and runs with bounded
parallelism through one admin client (kubernetes-asyncio allows 100 connections per client).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import structlog

from roles.cloud.transport.auth import token_secret
from roles.kube import Conflict, Kube, open_kube
from roles.kube.resources import NODES, SECRETS
from schemas.core import EDGE_ROLE_LABEL, Node, NodeCondition, NodeStatus
from schemas.meta import ObjectMeta
from tools.provision.controlplane import AGENT_ONLY_NODES, ControlPlane, ensure_binaries, start

REPO = Path(__file__).resolve().parent.parent
CRD_DIR = REPO / "schemas" / "crds"
TOKEN_NAMESPACE = "kube-system"
FLEET_LABEL = "bench.nodetaskd.io/fleet"
REGISTER_PARALLEL = 64


def node_name(index: int) -> str:
    return f"bench-{index:05d}"


def first_label(size: int) -> str:
    """The label carried by the first ``size`` nodes of the fleet (a job's label selector)."""
    return f"bench.nodetaskd.io/first-{size}"


def fleet_seed(cp: ControlPlane) -> str:
    """The token seed of this control plane's fleet (derived from, but not revealing, its admin token)."""
    return hashlib.sha256(b"nodetaskd-bench:" + cp.tokens["admin"].encode()).hexdigest()


def edge_token(seed: str, node: str) -> str:
    return hmac.new(seed.encode(), node.encode(), hashlib.sha256).hexdigest()[:32]


@asynccontextmanager
async def control_plane(cluster_dir: Path | None, state_dir: Path) -> AsyncIterator[ControlPlane]:
    """A control plane with RBAC and CRDs: attached to ``cluster_dir``, or started in ``state_dir``."""
    if cluster_dir is not None:
        cp = ControlPlane.load(cluster_dir)
        owned = False
    else:
        binaries = await anyio.to_thread.run_sync(ensure_binaries)
        # Started from the main thread (blocking the loop for those seconds, when nothing else runs):
        # only then does the kernel stop etcd and kube-apiserver should this process die without
        # its clean-up (SIGKILL), as start() arms them to die with the thread that started them.
        cp = start(state_dir, binaries, node_monitor=AGENT_ONLY_NODES)
        owned = True
    try:
        await anyio.to_thread.run_sync(cp.apply_rbac)
        await anyio.to_thread.run_sync(lambda: cp.kubectl("apply", "-f", str(CRD_DIR)))
        await anyio.to_thread.run_sync(
            lambda: cp.kubectl("wait", "--for=condition=established", "--timeout=60s", "-f", str(CRD_DIR))
        )
        yield cp
    finally:
        if owned:
            # Shielded: after SIGTERM or Ctrl-C this runs in a cancelled scope.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(cp.stop)


@asynccontextmanager
async def admin(cp: ControlPlane) -> AsyncIterator[Kube]:
    async with open_kube(kubeconfig=str(cp.kubeconfig("admin")), log=structlog.get_logger()) as kube:
        yield kube


async def register_fleet(kube: Kube, *, count: int, sizes: Iterable[int], seed: str) -> float:
    """Ensure nodes 0..count-1 exist, Ready, labelled, with their token Secrets; returns seconds taken."""
    size_list = sorted(set(sizes))
    limiter = anyio.CapacityLimiter(REGISTER_PARALLEL)
    started = anyio.current_time()

    async def one(index: int) -> None:
        name = node_name(index)
        labels = {EDGE_ROLE_LABEL: "", FLEET_LABEL: "", **{first_label(s): "" for s in size_list if index < s}}
        async with limiter:
            await _ensure_node(kube, name, labels)
            await _ensure_secret(kube, name, edge_token(seed, name))

    async with anyio.create_task_group() as tg:
        for index in range(count):
            tg.start_soon(one, index)
    return anyio.current_time() - started


async def _ensure_node(kube: Kube, name: str, labels: dict[str, str]) -> None:
    # A Node may be created with its status (the API server keeps it, as for a kubelet registering).
    ready = NodeStatus(conditions=(NodeCondition(type="Ready", status="True", reason="Bench", message="bench"),))
    try:
        await kube.create(NODES, Node(metadata=ObjectMeta(name=name, labels=labels), status=ready))
    except Conflict:
        await kube.merge_patch(NODES, name, {"metadata": {"labels": labels}})


async def _ensure_secret(kube: Kube, name: str, token: str) -> None:
    secret = token_secret(name, token, namespace=TOKEN_NAMESPACE)
    try:
        await kube.create(SECRETS, secret, namespace=TOKEN_NAMESPACE)
    except Conflict:
        current = await kube.get(SECRETS, secret.metadata.name, namespace=TOKEN_NAMESPACE)
        if current.data != secret.data or current.metadata.labels != secret.metadata.labels:
            meta = msgspec.structs.replace(current.metadata, labels=secret.metadata.labels)
            await kube.replace(SECRETS, msgspec.structs.replace(secret, metadata=meta))
