"""One cache session's side of the hub's shared cache streams: what its edge has been sent, and how.

Everything for one edge's cache goes through :meth:`Feed.push`, which never waits: it offers the
frame to the session's bounded queue (:meth:`~roles.cloud.sessions.Session.offer`), shared with the
session's other frames. A full queue means the edge has fallen behind: the feed stops taking
frames, forgets what it had sent, and the streams relist it (every collection sent again, after a
pause that grows while the edge keeps falling behind), so that one slow edge never holds up the
watches every other edge is fed from.

A collection is sent whole (``CacheObjects`` with ``replace``) in one frame when it fits the edge's
frame limit; otherwise, to an edge listing :data:`~nodetask.messages.CACHE_CHUNKS_CAPABILITY`, as a
replace in chunks (:func:`nodetask.cache_chunks.split`), and to an older edge object by object.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec
import structlog

from nodetask import cache_chunks, messages
from nodetask.messages import CacheKey, CacheObjects, Downstream
from nodetask.pod_references import PodReferences
from roles.cloud.cache.objects import CONFIG_MAP, NODE, POD, SECRET, Key, raw_key
from roles.cloud.sessions import Session
from schemas.core import RawObject

__all__ = ["BITS", "Feed", "PodEntry"]

Log = structlog.typing.FilteringBoundLogger

BITS: Final = {NODE: 1, POD: 2, CONFIG_MAP: 4, SECRET: 8}
"""Each kind's bit in :attr:`Feed.sent`."""


@dataclass(slots=True)
class PodEntry:
    """A Pod bound to a connected node: its resourceVersion and what it references."""

    rv: int
    refs: PodReferences


class Feed:
    """The cache stream of one session (its node's objects); the index and the streams keep it current."""

    __slots__ = (
        "_behind",
        "_frame_limit",
        "_on_behind",
        "behinds",
        "chunks",
        "failures",
        "fetching",
        "filling",
        "last_behind",
        "log",
        "node",
        "node_rv",
        "pod_floor",
        "pods",
        "refs",
        "requested",
        "secrets",
        "sent",
        "session",
    )

    def __init__(
        self,
        session: Session,
        *,
        secrets: bool,
        chunks: bool,
        frame_limit: int,
        log: Log,
        on_behind: Callable[[Feed], None],
    ) -> None:
        self.session = session
        self.node = session.node
        self.secrets = secrets
        """Whether this edge gets Secrets (it lists ``cache.secrets`` and the hub caches them)."""
        self.chunks = chunks
        """Whether this edge takes a replace in chunks (it lists ``cache.chunks``)."""
        self.log = log
        self.sent = 0
        """The kinds (:data:`BITS`) whose collection this edge has been sent; changes follow only for those."""
        self.filling: dict[str, list[tuple[RawObject, bool]]] | None = None
        """Kinds (Node, Pod) being listed for this node, with the watch events met meanwhile (each list
        is also the token of its fill: a fill whose list is no longer here is stale)."""
        self.pods: dict[tuple[str, str], PodEntry] = {}
        self.refs: dict[Key, int] = {}
        """ConfigMaps and Secrets this node's Pods reference, with how many of its Pods do."""
        self.node_rv = 0
        self.pod_floor = 0
        """The resourceVersion of the last list of this node's Pods: older watch events are stale."""
        self.requested: bool | None = None
        """The autonomy request last sent (None: not yet)."""
        self.failures = 0
        """Consecutive failed lists for this node (the retry backoff's exponent)."""
        self.behinds = 0
        self.last_behind = -math.inf
        self.fetching: set[CacheKey] = set()
        """Keys of CacheFetch answers waiting for (or under) a read of the API server: asked for again
        meanwhile, they are not read again."""
        self._frame_limit = frame_limit
        self._on_behind = on_behind
        self._behind = False

    @property
    def behind(self) -> bool:
        return self._behind

    def has(self, kind: str) -> bool:
        """Whether this edge has been sent ``kind``'s collection."""
        return bool(self.sent & BITS[kind])

    def stop(self) -> None:
        """Forget what was sent and what is under way: nothing more is sent until a relist, which
        calls :meth:`resume` as it begins."""
        self.sent = 0
        self.filling = None

    def resume(self) -> None:
        """A relist begins: take frames again."""
        self._behind = False

    def push(self, msg: Downstream) -> bool:
        """Offer ``msg`` to the session without waiting; False (and the feed falls behind) if it cannot take it."""
        return self._offer(messages.encode(msg), str(type(msg).__struct_config__.tag))

    def push_collection(self, kind: str, objects: list[msgspec.Raw], resource_version: int) -> None:
        """Send ``kind``'s whole collection (a replace) and mark it sent.

        A collection too large for one frame would make the edge close the session, again at every
        reconnect: it goes in chunks to an edge that takes them, each within the frame limit, and to
        an older edge object by object instead (without a replace, what that edge holds beyond them
        stays until it is deleted). A single object too large for any frame is left out, logged (in
        chunks the edge is told to keep what it holds of it).
        """
        msg = CacheObjects(kind=kind, objects=tuple(objects), replace=True, resource_version=str(resource_version))
        frame = messages.encode(msg)
        if len(frame) <= self._frame_limit:
            if self._offer(frame, "cache_objects"):
                self.sent |= BITS[kind]
            return
        if self.chunks:
            self._push_chunks(kind, objects, str(resource_version))
            return
        self.log.warning("cache_collection_too_large", kind=kind, objects=len(objects), frame_bytes=len(frame))
        for obj in objects:
            one = messages.encode(CacheObjects(kind=kind, objects=(obj,)))
            if len(one) > self._frame_limit:
                self.log.warning("cache_object_too_large", kind=kind, frame_bytes=len(one))
                continue
            if not self._offer(one, "cache_objects"):
                return
        self.sent |= BITS[kind]

    def _push_chunks(self, kind: str, objects: list[msgspec.Raw], resource_version: str) -> None:

        def key_of(obj: msgspec.Raw) -> CacheKey:
            key = raw_key(kind, obj)
            self.log.warning("cache_object_too_large", kind=kind, name=key.name, object_bytes=len(obj))
            return key

        chunks = cache_chunks.split(
            kind,
            objects,
            # Never one an edge saw before, from this hub or another: a late chunk of an earlier replace
            # can then only be out of place.
            replace=uuid.uuid4().hex,
            resource_version=resource_version,
            limit=self._frame_limit,
            key_of=key_of,
        )
        self.log.info("cache_collection_chunked", kind=kind, objects=len(objects), chunks=len(chunks))
        for chunk in chunks:
            # Cut short (the edge fell behind): the relist sends a new replace, whose first chunk takes
            # the place of what the edge staged of this one.
            if not self._offer(messages.encode(chunk), "cache_chunk"):
                return
        self.sent |= BITS[kind]

    def _offer(self, frame: bytes, op: str) -> bool:
        if self._behind:
            return False
        if self.session.offer(frame, op):
            return True
        if not self.session.closed.is_set():
            self._behind = True
            self._on_behind(self)
        return False
