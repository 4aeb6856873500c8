"""What the device's local API reads: a view of its cache of cloud objects, and an in-memory one.

:class:`CacheView` is the seam between the local API (:mod:`roles.edge.local_api.local_api`) and however the
cache is kept: whatever holds the node's copy of its Node, Pods, ConfigMaps and Secrets implements
these three methods, and the API needs nothing else from it. :class:`MemoryCache` is the plain
implementation, for tests and benchmarks; the agent serves :class:`roles.edge.cache.durable_cache.DurableCache`.

Objects are decoded JSON (dicts) as the cloud's API server sent them; kinds are Kubernetes kind
names (``"Pod"``). Resource versions are the cloud's: decimal integers (etcd revisions), compared as
numbers, so that the API can tell which changes a listing already holds.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Final, Protocol, final

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = [
    "CacheView",
    "Change",
    "ChangeType",
    "Listing",
    "MemoryCache",
    "Object",
    "Subscribers",
    "object_key",
    "resource_version",
]

Object = dict[str, Any]
"""A Kubernetes object as decoded JSON."""


class ChangeType(enum.StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


class Change(msgspec.Struct, frozen=True):
    """One change to a cached object: the object after it (the last state, for a deletion) and before it."""

    type: ChangeType
    object: Object
    previous: Object | None = None
    """The object before a MODIFIED change; a watch with a selector needs it to tell an object that
    leaves the selection (a DELETED event for that watch) from one that was never in it."""


class Listing(msgspec.Struct, frozen=True):
    """The objects of a kind (in one namespace, or all) and the resource version they are current at."""

    items: list[Object]
    resource_version: str


class CacheView(Protocol):
    """Read access to the cached objects, and their changes as they happen."""

    async def get(self, kind: str, namespace: str, name: str) -> Object | None:
        """The object, or None; ``namespace`` is ``""`` for a cluster-scoped kind (Node)."""
        ...

    async def list(self, kind: str, namespace: str) -> Listing:
        """The objects of ``kind`` in ``namespace`` (``""``: all), ordered by namespace and name."""
        ...

    def subscribe(self, kind: str) -> AbstractContextManager[MemoryObjectReceiveStream[Change]]:
        """Changes to ``kind`` made from now on, until the block ends.

        Delivery never blocks the cache: a subscriber that falls behind by more than its buffer has
        its stream closed (its receiver sees the end), and must list again, as a Kubernetes watch
        client does when the API server ends its watch.
        """
        ...


def resource_version(obj: Mapping[str, Any]) -> int:
    """``metadata.resourceVersion`` as a number.

    Errors: ValueError naming the object when it has none or it is not a decimal integer.
    """
    meta = obj.get("metadata")
    text = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    if not isinstance(text, str) or not text.isascii() or not text.isdecimal():
        raise ValueError(f"object {object_key(obj)} has no numeric metadata.resourceVersion: {text!r}")
    return int(text)


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)`` of ``obj`` (namespace ``""`` for a cluster-scoped one).

    Errors: ValueError when it has no ``metadata.name``.
    """
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise ValueError("object has no metadata.name")
    namespace = meta.get("namespace", "")
    return (namespace if isinstance(namespace, str) else "", meta["name"])


SUBSCRIBER_BUFFER: Final = 1000
"""Changes a subscriber may be behind before its stream is closed: more than a node's Pods, ConfigMaps
and Secrets all changing at once."""


@final
class Subscribers:
    """The subscriptions of a cache, by kind: how every :class:`CacheView` implements ``subscribe``."""

    def __init__(self, *, buffer: int = SUBSCRIBER_BUFFER) -> None:
        self._by_kind: dict[str, set[MemoryObjectSendStream[Change]]] = {}
        self._buffer = buffer

    @contextmanager
    def subscribe(self, kind: str) -> Iterator[MemoryObjectReceiveStream[Change]]:
        """As :meth:`CacheView.subscribe`."""
        send, receive = anyio.create_memory_object_stream[Change](self._buffer)
        subscribers = self._by_kind.setdefault(kind, set())
        subscribers.add(send)
        try:
            with send, receive:
                yield receive
        finally:
            subscribers.discard(send)

    def publish(self, kind: str, change: Change) -> None:
        """Tell every subscriber of ``kind`` about ``change``, without ever waiting."""
        for send in list(self._by_kind.get(kind, ())):
            try:
                send.send_nowait(change)
            except anyio.WouldBlock:
                # Behind by a whole buffer: end its stream rather than hold up the cache or drop a change.
                self._by_kind[kind].discard(send)
                send.close()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._by_kind[kind].discard(send)


@final
class MemoryCache:
    """A :class:`CacheView` over dicts in memory, fed with :meth:`put`, :meth:`delete` and :meth:`replace`.

    As the durable cache must, it never lets an older resource version overwrite a newer one.
    """

    def __init__(self, *, subscriber_buffer: int = SUBSCRIBER_BUFFER) -> None:
        self._objects: dict[str, dict[tuple[str, str], Object]] = {}
        self._versions: dict[str, int] = {}
        self._subscribers = Subscribers(buffer=subscriber_buffer)

    def put(self, kind: str, obj: Object) -> None:
        """Add or update ``obj`` unless the cache holds a newer version of it."""
        version, key = resource_version(obj), object_key(obj)
        objects = self._objects.setdefault(kind, {})
        previous = objects.get(key)
        if previous is not None and resource_version(previous) > version:
            return
        objects[key] = obj
        self._advance(kind, version)
        change = Change(ChangeType.ADDED, obj) if previous is None else Change(ChangeType.MODIFIED, obj, previous)
        self._subscribers.publish(kind, change)

    def delete(self, kind: str, obj: Object) -> None:
        """Remove the object ``obj`` names; its resource version is the deletion's, as in a watch event."""
        version, key = resource_version(obj), object_key(obj)
        objects = self._objects.get(kind, {})
        previous = objects.get(key)
        if previous is None or resource_version(previous) > version:
            return
        del objects[key]
        self._advance(kind, version)
        self._subscribers.publish(kind, Change(ChangeType.DELETED, obj))

    def replace(self, kind: str, items: Iterable[Object], version: str) -> None:
        """Make ``items`` the whole collection of ``kind``, current at ``version`` (a fresh list from the
        cloud), telling subscribers what changed; objects gone are deleted at ``version``."""
        fresh = {object_key(obj): obj for obj in items}
        old = self._objects.get(kind, {})
        self._objects[kind] = fresh
        self._versions[kind] = int(version)
        for key, last in old.items():
            if key not in fresh:
                gone = {**last, "metadata": {**last["metadata"], "resourceVersion": version}}
                self._subscribers.publish(kind, Change(ChangeType.DELETED, gone))
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._subscribers.publish(kind, Change(ChangeType.ADDED, obj))
            elif before != obj:
                self._subscribers.publish(kind, Change(ChangeType.MODIFIED, obj, before))

    async def get(self, kind: str, namespace: str, name: str) -> Object | None:
        return self._objects.get(kind, {}).get((namespace, name))

    async def list(self, kind: str, namespace: str) -> Listing:
        objects = self._objects.get(kind, {})
        keys = sorted(k for k in objects if not namespace or k[0] == namespace)
        return Listing(items=[objects[k] for k in keys], resource_version=str(self._versions.get(kind, 0)))

    def subscribe(self, kind: str) -> AbstractContextManager[MemoryObjectReceiveStream[Change]]:
        return self._subscribers.subscribe(kind)

    def _advance(self, kind: str, version: int) -> None:
        self._versions[kind] = max(self._versions.get(kind, 0), version)
