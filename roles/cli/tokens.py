"""``nodetaskd token create NODE``: the node's edge token, created or rotated in the API server.

The token is the ``token`` key of Secret ``nodetaskd-edge-<node>`` in the hubs' ``tokenNamespace``,
labelled ``nodetask.kubeedge.io/edge-token`` so that the hubs watch it (``roles.cloud.transport.auth``, whose
:func:`~roles.cloud.transport.auth.token_secret` builds it). Creating it again rotates it: the hubs refuse the
old token as soon as the change reaches them. The new token goes to a file (0600) for the operator
to carry to the device, never onto the terminal unless asked for (``--token-file -``); the command
prints the ``nodetaskd edge join`` line to run there.
"""

from __future__ import annotations

import base64
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

import structlog

from nodetask.names import clip, object_name_problem
from roles.cli.token_format import TOKEN_BYTES
from roles.cloud.transport.auth import TOKEN_KEY, TOKEN_LABEL, token_secret, token_secret_name
from roles.common.files import write_atomically
from roles.kube import Conflict, Kube, NotFound
from roles.kube.resources import NODES, SECRETS

__all__ = ["TokenCreated", "create_token", "join_command", "write_token"]

Log = structlog.typing.FilteringBoundLogger


@dataclass(frozen=True, slots=True)
class TokenCreated:
    node: str
    namespace: str
    secret: str
    token: str
    rotated: bool
    """The Secret existed: its old token is refused from now on."""
    node_exists: bool


async def create_token(kube: Kube, node: str, *, namespace: str) -> TokenCreated:
    """Create ``node``'s token Secret, or give the existing one a new token (and the watch label).

    Errors: :class:`ValueError` naming a node name Kubernetes would refuse; the API's own errors.
    """
    if problem := object_name_problem(node):
        raise ValueError(f"{clip(node)!r} is not a Kubernetes node name: {problem}")
    token = secrets.token_urlsafe(TOKEN_BYTES)
    secret = token_secret(node, token, namespace=namespace)
    rotated = False
    try:
        await kube.create(SECRETS, secret, namespace=namespace)
    except Conflict:
        encoded = base64.b64encode(token.encode()).decode()
        patch = {"metadata": {"labels": {TOKEN_LABEL: ""}}, "data": {TOKEN_KEY: encoded}}
        await kube.merge_patch(SECRETS, secret.metadata.name, patch, namespace=namespace)
        rotated = True
    try:
        await kube.get(NODES, node)
        node_exists = True
    except NotFound:
        node_exists = False
    return TokenCreated(
        node=node,
        namespace=namespace,
        secret=token_secret_name(node),
        token=token,
        rotated=rotated,
        node_exists=node_exists,
    )


def write_token(path: Path, token: str, *, overwrite: bool = False) -> None:
    """The token, readable by its owner only, written whole or not at all.

    Errors: :class:`FileExistsError` when ``path`` exists and not ``overwrite`` (``--force``).
    """
    write_atomically(path, f"{token}\n".encode(), mode=0o600, replace=overwrite)


def join_command(node: str, *, hubs: tuple[str, ...], token_file: str, ca_file: str = "") -> str:
    """The ``nodetaskd edge join`` line for the device."""
    argv = ["nodetaskd", "edge", "join"]
    for hub in hubs or ("wss://<hub address>:10004",):
        argv += ["--hub", hub]
    argv += ["--node", node, "--token-file", token_file]
    if ca_file:
        argv += ["--ca-file", ca_file]
    return shlex.join(argv)
