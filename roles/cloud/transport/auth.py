"""Edge authentication: each edge presents a per-node bearer token kept in a Secret.

The token of node ``N`` is the ``token`` key of Secret ``nodetaskd-edge-N`` in the hub's token
namespace. An edge sends ``Authorization: Bearer <token>`` on the websocket handshake (and on the
KubeEdge-compatible HTTP endpoint) and names its node in the URL path, so a session is bound to
one node before any frame is read.

Secrets labelled :data:`TOKEN_LABEL` are watched, so a fleet reconnecting to a restarted hub costs
no API call per edge, and a rotated or deleted token stops working as soon as the change arrives.
Any other Secret (or every Secret, while the watch is not synced, failing or not allowed) is read with a GET;
a token that checked out that way is cached for ``ttl`` seconds. A token that does not match is
re-read, so a rotation works whichever way the old token was known, but at most once per node
every ``reread_after`` seconds: what a read found (a token, no Secret, a malformed one) answers
every check of that node meanwhile, and checks arriving while a read is in flight share it. So
2,000 wrong tokens cost one read per node, not 2,000; a rotation is refused for at most those few
seconds (the edge retries), and not at all when the Secret is watched.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import math
from collections.abc import Callable
from typing import Final

import anyio
import anyio.abc
import structlog

from nodetask.names import clip, object_name_problem
from roles.cloud.api import SecretSource
from roles.common.edge_tokens import SECRET_PREFIX, TOKEN_KEY, TOKEN_LABEL, token_secret_name
from roles.kube import ApiError, Deleted, Interrupted, Invalid, NotFound, Relisted, Upserted, WatchEvent
from roles.kube.resources import SECRETS
from schemas.core import Secret
from schemas.meta import ObjectMeta

__all__ = [
    "READS_IN_FLIGHT",
    "READ_ANSWERS_KEPT",
    "SECRET_PREFIX",
    "TOKEN_KEY",
    "TOKEN_LABEL",
    "AuthError",
    "TokenBook",
    "bearer_token",
    "token_secret",
    "token_secret_name",
]

Log = structlog.typing.FilteringBoundLogger

READS_IN_FLIGHT: Final = 8
"""Secret GETs at once. Anyone can present a wrong token and cause one: they must not take the API
client's request slots from status writes and Node marks."""
READ_ANSWERS_KEPT: Final = 4096
"""Recent reads remembered (by node name, which anyone can choose): the oldest go first."""


def token_secret(node: str, token: str, *, namespace: str) -> Secret:
    """The Secret that gives ``node`` its edge token, labelled so that hubs watch it."""
    meta = ObjectMeta(name=token_secret_name(node), namespace=namespace, labels={TOKEN_LABEL: ""})
    return Secret(metadata=meta, type="Opaque", data={TOKEN_KEY: base64.b64encode(token.encode()).decode()})


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
    """Checks edge tokens against their Secrets; run :meth:`watch` to know labelled ones without GETs."""

    def __init__(
        self,
        kube: SecretSource,
        *,
        namespace: str,
        log: Log,
        ttl: float = 60.0,
        reread_after: float = 5.0,
        on_read: Callable[[], object] = lambda: None,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._log = log
        self._ttl = ttl
        self._reread_after = reread_after
        self._known: dict[str, tuple[bytes, float]] = {}
        self._answers: dict[str, tuple[bytes | AuthError, float]] = {}
        """What the last read of each node's Secret found, and until when it stands in for a new read."""
        self._in_flight: dict[str, anyio.Event] = {}
        """Reads under way, by node: a check for the same node waits for it instead of reading too."""
        self._watched: dict[str, bytes] | None = None
        """Tokens of the labelled Secrets, by node; None until the watch has listed them, and while it fails."""
        self._changes = 0
        """Watch events seen: a GET answered across one of them is used, but not cached."""
        self._on_read = on_read
        """Called for each Secret read one by one (a GET), for the hub's metrics."""
        self._reads = anyio.CapacityLimiter(READS_IN_FLIGHT)

    async def check(self, node: str, token: str) -> None:
        """Return if ``token`` is ``node``'s; raise :class:`AuthError` saying why not."""
        if not node:
            raise AuthError(404, "no node named in the path")
        problem = object_name_problem(node)
        if problem:  # never part of a Secret's name, so no read can be steered elsewhere
            raise AuthError(400, f"node name {clip(node)!r} {problem}")
        if not token:
            raise AuthError(401, "missing bearer token")
        presented = token.encode()
        watched = self._watched.get(node) if self._watched is not None else None
        if watched is not None and hmac.compare_digest(watched, presented):
            return
        cached = self._known.get(node)
        if cached is not None and cached[1] > anyio.current_time() and hmac.compare_digest(cached[0], presented):
            return
        expected, settled = await self._expected(node)
        if not hmac.compare_digest(expected, presented):
            raise AuthError(403, f"the token is not node {node}'s")
        if settled:
            self._known[node] = (expected, anyio.current_time() + self._ttl)

    async def _expected(self, node: str) -> tuple[bytes, bool]:
        """``node``'s token from a recent read, a read in flight or a new read; and whether it may be cached.

        A read answered across a watch event is used but not kept (the Secret may have changed since).
        """
        while True:
            answer = self._answers.get(node)
            if answer is not None and answer[1] > anyio.current_time():
                return _token_or_raise(answer[0]), True
            in_flight = self._in_flight.get(node)
            if in_flight is None:
                break
            await in_flight.wait()  # then look again: it left its answer, unless it could not read
        done = self._in_flight[node] = anyio.Event()
        changes = self._changes
        try:
            try:
                found: bytes | AuthError = await self._read(node)
            except AuthError as exc:
                if exc.status >= 500:
                    raise  # the API server did not answer: nothing learnt about the Secret
                found = exc
            settled = changes == self._changes
            if settled:
                self._remember(node, found)
        finally:
            del self._in_flight[node]
            done.set()
        return _token_or_raise(found), settled

    def _remember(self, node: str, found: bytes | AuthError) -> None:
        self._answers.pop(node, None)
        while len(self._answers) >= READ_ANSWERS_KEPT:
            del self._answers[next(iter(self._answers))]
        self._answers[node] = (found, anyio.current_time() + self._reread_after)

    @property
    def synced(self) -> bool:
        """Whether the watch has listed the token Secrets and is not failing."""
        return self._watched is not None

    def watching(self, node: str) -> bool:
        """Whether ``node``'s token is known from the watch (so checking it reads nothing)."""
        return self._watched is not None and node in self._watched

    async def watch(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the labelled token Secrets' tokens until cancelled; ready at once, since GETs cover the gap."""
        send, receive = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
        task_status.started()
        async with anyio.create_task_group() as tg, receive:
            tg.start_soon(self._follow, receive)
            await self._kube.watch(SECRETS, send, label_selector=TOKEN_LABEL, namespace=self._namespace)

    async def _follow(self, events: anyio.abc.ObjectReceiveStream[WatchEvent]) -> None:
        # Whatever the watch says also ends tokens cached from a GET, so a rotation or a deletion is
        # never outlived by the cache; while the watch fails, nothing it said is trusted.
        async for event in events:
            self._changes += 1
            match event:
                case Relisted(objects=secrets, invalid=invalid):
                    self._relisted(secrets, invalid)
                case Interrupted(error=error) if self._watched is not None:
                    self._log.warning("token_watch_interrupted", error=error)
                    self._watched = None
                case Upserted(obj=secret) if self._watched is not None:
                    node, token = self._token_of(secret)
                    self._forget(node)
                    if node and token:
                        self._watched[node] = token
                case Deleted(obj=secret) if self._watched is not None:
                    self._forget(self._token_of(secret)[0])
                case Invalid(name=name, error=error):
                    # Not decodable, so not trusted: that node's token is read again.
                    self._log.warning("token_secret_invalid", secret=name, error=error)
                    self._forget(name.removeprefix(SECRET_PREFIX))

    def _relisted(self, secrets: tuple[Secret, ...], invalid: tuple[Invalid, ...]) -> None:
        watched: dict[str, bytes] = {}
        for secret in secrets:
            node, token = self._token_of(secret)
            if node and token:
                watched[node] = token
        for bad in invalid:
            self._log.warning("token_secret_invalid", secret=bad.name, error=bad.error)
        if self._watched is None:
            self._log.info("token_secrets_listed", count=len(watched))
        self._known.clear()
        self._answers.clear()
        self._watched = watched

    def _forget(self, node: str) -> None:
        self._known.pop(node, None)
        self._answers.pop(node, None)
        if self._watched is not None:
            self._watched.pop(node, None)

    def _token_of(self, secret: Secret) -> tuple[str, bytes]:
        """The node a token Secret belongs to and its token; the token is empty when malformed."""
        name = secret.metadata.name
        if not name.startswith(SECRET_PREFIX):
            return "", b""
        token = _decode_token(secret)
        if not token:
            self._log.warning("token_secret_malformed", secret=name)
        return name.removeprefix(SECRET_PREFIX), token

    async def _read(self, node: str) -> bytes:
        name = token_secret_name(node)
        self._on_read()
        try:
            async with self._reads:
                secret = await self._kube.get(SECRETS, name, namespace=self._namespace)
        except NotFound:
            raise AuthError(403, f"node {node} has no token Secret {self._namespace}/{name}") from None
        except ApiError as exc:
            self._log.warning("token_unreadable", node=node, error=str(exc))
            raise AuthError(503, "cannot read the node's token now") from None
        value = _decode_token(secret)
        if not value:
            self._log.warning("token_secret_malformed", node=node, secret=name)
            raise AuthError(403, f"Secret {self._namespace}/{name} has no valid {TOKEN_KEY!r} key")
        return value


def _token_or_raise(found: bytes | AuthError) -> bytes:
    if isinstance(found, AuthError):
        raise AuthError(found.status, str(found))
    return found


def _decode_token(secret: Secret) -> bytes:
    try:
        return base64.b64decode(secret.data.get(TOKEN_KEY, ""), validate=True).strip()
    except binascii.Error:
        return b""
