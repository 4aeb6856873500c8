"""What the API server's answers to the kubelet put in the device's cache: pure functions over them.

The autonomy seed's model: the device's proxy "writes all the objects responded to the node to disk".
An object got, created, updated or patched is an upsert; a list is too, except one that is the whole of
what the node sees of its kind (its pods by ``spec.nodeName``, its own Node by name, every Service),
which replaces that collection, so that what was deleted meanwhile leaves the cache; a watch's events
are upserts and deletions as they come. Only the kinds the cache takes
(:data:`roles.edge.cache.kinds.RESOURCES`) are fed, and only from answers that succeeded. The same
cache is fed by the hub's streams; resource versions (one etcd's) order the two.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nodetask.messages import CacheDeleted, CacheKey, CacheObjects
from roles.edge.local_api.paths import Target, parse_target

__all__ = ["WatchLines", "answer_feed", "event_feed", "object_target", "wants_watch"]

CacheFeed = CacheObjects | CacheDeleted
MAX_EVENT_BYTES: Final = 16 << 20
"""Longest watch event line the feed reads (the API server's request limit is 3 MiB of object)."""
_SUBRESOURCES: Final = frozenset({"status"})


class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""


class _Head(msgspec.Struct):
    kind: str = ""
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _List(msgspec.Struct):
    items: list[msgspec.Raw] = []
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


_head = msgspec.json.Decoder(_Head).decode
_list = msgspec.json.Decoder(_List).decode
_event = msgspec.json.Decoder(_Event).decode


def object_target(path: str) -> tuple[Target | None, str]:
    """The cached kind a path names (its ``status`` subresource names the object too), and the subresource."""
    head, _, last = path.rstrip("/").rpartition("/")
    if last in _SUBRESOURCES and (target := parse_target(head)) is not None and target.name:
        return target, last
    return parse_target(path), ""


def wants_watch(target: Target | None, query: dict[str, list[str]]) -> bool:
    """Whether a GET is a watch (``watch=true`` or a legacy ``/watch/`` path)."""
    return (target is not None and target.watch) or query.get("watch", [""])[0].lower() in ("true", "1")


def _whole(target: Target, query: dict[str, list[str]], node: str) -> bool:
    """Whether a list is the whole of what the node sees of its kind."""
    if target.namespace or query.get("labelSelector", [""])[0]:
        return False
    fields = query.get("fieldSelector", [""])[0]
    match target.resource.kind:
        case "Pod":
            return fields == f"spec.nodeName={node}"
        case "Node":
            return fields == f"metadata.name={node}"
        case "Service":
            return not fields
    return False


def answer_feed(
    method: str, path: str, query: dict[str, list[str]], *, node: str, status: int, body: bytes
) -> tuple[CacheFeed, ...]:
    """What a successful answer (not a watch's) puts in the cache; nothing for anything else."""
    if status not in (200, 201) or not body:
        return ()
    target, _ = object_target(path)
    if target is None:
        return ()
    kind = target.resource.kind
    try:
        if method == "GET" and not target.name:
            listed = _list(body)
            return (
                CacheObjects(
                    kind=kind,
                    objects=tuple(listed.items),
                    replace=_whole(target, query, node),
                    resource_version=listed.metadata.resourceVersion,
                ),
            )
        head = _head(body)
    except msgspec.DecodeError:
        return ()  # not JSON (a client that asked for protobuf): nothing the cache can read
    if head.kind != kind or not head.metadata.name:
        return ()  # a Status (a delete's answer), or another kind
    return (CacheObjects(kind=kind, objects=(msgspec.Raw(body),)),)


def event_feed(kind: str, line: bytes) -> CacheFeed | None:
    """What one watch event puts in the cache (None for a bookmark, an error or anything unreadable)."""
    try:
        event = _event(line)
        if event.type in ("ADDED", "MODIFIED"):
            return CacheObjects(kind=kind, objects=(event.object,))
        if event.type == "DELETED":
            meta = _head(event.object).metadata
            key = CacheKey(kind=kind, namespace=meta.namespace, name=meta.name)
            return CacheDeleted(key=key, resource_version=meta.resourceVersion)
    except msgspec.DecodeError:
        pass
    return None


class WatchLines:
    """Splits a watch's body, as it arrives in pieces, into its event lines (newline-delimited JSON)."""

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self._partial = bytearray()
        self._limit = limit
        self.overflowed = False
        """A line exceeded the limit: the rest of this watch is not fed (the next list mends the cache)."""

    def feed(self, piece: bytes) -> list[bytes]:
        if self.overflowed:
            return []
        self._partial += piece
        *lines, rest = self._partial.split(b"\n")
        self._partial = bytearray(rest)
        if len(self._partial) > self._limit:
            self.overflowed = True
            self._partial = bytearray()
        return [bytes(line) for line in lines if line.strip()]
