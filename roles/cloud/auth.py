"""Edge authentication: each edge presents a per-node bearer token kept in a Secret.

The token of node ``N`` is the ``token`` key of Secret ``nodetaskd-edge-N`` in the hub's token
namespace. An edge sends ``Authorization: Bearer <token>`` on the websocket handshake (and on the
KubeEdge-compatible HTTP endpoint) and names its node in the URL path, so a session is bound to
one node before any frame is read. Tokens that checked out are cached for ``ttl`` seconds; a
failed check always re-reads the Secret, so a rotated token works at once.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Final

import anyio
import structlog

from roles.kube import ApiError, Kube, NotFound
from roles.kube.resources import SECRETS

Log = structlog.typing.FilteringBoundLogger

TOKEN_KEY: Final = "token"


def token_secret_name(node: str) -> str:
    """The Secret that holds ``node``'s edge token."""
    return f"nodetaskd-edge-{node}"


def bearer_token(headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]) -> str:
    """The bearer token of an ``Authorization`` header, or empty."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


class AuthError(Exception):
    """Authentication failed; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class TokenBook:
    """Checks edge tokens against their Secrets."""

    def __init__(self, kube: Kube, *, namespace: str, log: Log, ttl: float = 60.0) -> None:
        self._kube = kube
        self._namespace = namespace
        self._log = log
        self._ttl = ttl
        self._known: dict[str, tuple[bytes, float]] = {}

    async def check(self, node: str, token: str) -> None:
        """Return if ``token`` is ``node``'s; raise :class:`AuthError` saying why not."""
        if not node:
            raise AuthError(404, "no node named in the path")
        if not token:
            raise AuthError(401, "missing bearer token")
        presented = token.encode()
        cached = self._known.get(node)
        if cached is not None and cached[1] > anyio.current_time() and hmac.compare_digest(cached[0], presented):
            return
        expected = await self._read(node)
        if not hmac.compare_digest(expected, presented):
            raise AuthError(403, f"the token is not node {node}'s")
        self._known[node] = (expected, anyio.current_time() + self._ttl)

    async def _read(self, node: str) -> bytes:
        name = token_secret_name(node)
        try:
            secret = await self._kube.get(SECRETS, name, namespace=self._namespace)
        except NotFound:
            raise AuthError(403, f"node {node} has no token Secret {self._namespace}/{name}") from None
        except ApiError as exc:
            self._log.warning("token_unreadable", node=node, error=str(exc))
            raise AuthError(503, "cannot read the node's token now") from None
        raw = secret.data.get(TOKEN_KEY, "")
        try:
            value = base64.b64decode(raw, validate=True)
        except binascii.Error:
            value = b""
        if not value:
            self._log.warning("token_secret_malformed", node=node, secret=name)
            raise AuthError(403, f"Secret {self._namespace}/{name} has no valid {TOKEN_KEY!r} key")
        return value.strip()
