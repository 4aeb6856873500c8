"""A durable cache over a real store, for the cache's tests, and the hub's cache messages they send it."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import pytest
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from nodetask.messages import CacheKey, CacheObjects
from roles.edge.cache.durable_cache import DurableCache
from roles.edge.cache.view import Change, ChangeType, Object
from roles.edge.store.store import EdgeStore, StoreError, StoreFault, open_store

PAGE = 4096


def obj(name: str, rv: int, *, ns: str = "ns", data: str = "") -> Object:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv)}, "data": {"v": data}}


def raw(*objects: Object) -> tuple[msgspec.Raw, ...]:
    return tuple(msgspec.Raw(msgspec.json.encode(o)) for o in objects)


def upsert(kind: str, *objects: Object) -> CacheObjects:
    return CacheObjects(kind=kind, objects=raw(*objects))


def relist(kind: str, version: int | None, *objects: Object) -> CacheObjects:
    return CacheObjects(kind=kind, objects=raw(*objects), replace=True, resource_version=str(version or ""))


def key(name: str, kind: str = "ConfigMap", ns: str = "ns") -> CacheKey:
    return CacheKey(kind=kind, namespace=ns, name=name)


@asynccontextmanager
async def opened(
    home: Path, *, keep_secrets: bool = False, max_bytes: int | None = None
) -> AsyncIterator[DurableCache]:
    async with open_store(home / "store.sqlite", max_bytes=max_bytes) as store:
        yield await DurableCache.open(store, home, keep_secrets=keep_secrets, log=structlog.get_logger())


async def versions(cache: DurableCache, kind: str = "ConfigMap") -> dict[str, int]:
    listing = await cache.list(kind, "")
    return {o["metadata"]["name"]: int(o["metadata"]["resourceVersion"]) for o in listing.items}


def mirror(changes: MemoryObjectReceiveStream[Change], into: dict[str, int]) -> None:
    """Apply the changes waiting in a subscription to ``into``, as a watch client would."""
    while True:
        try:
            change = changes.receive_nowait()
        except anyio.WouldBlock:
            return
        name = change.object["metadata"]["name"]
        if change.type is ChangeType.DELETED:
            del into[name]
        else:
            into[name] = int(change.object["metadata"]["resourceVersion"])


async def _fill(store: EdgeStore) -> None:
    for i in itertools.count():
        await store.set_fact(f"filler-{i}", "x" * PAGE)


@asynccontextmanager
async def full(home: Path) -> AsyncIterator[DurableCache]:
    """The cache in ``home`` with its store filled up (by facts, not cached objects): no room for a page more."""
    size = (home / "store.sqlite").stat().st_size
    async with open_store(home / "store.sqlite", max_bytes=size + 8 * PAGE) as store:
        with pytest.raises(StoreError) as caught:
            await _fill(store)
        assert caught.value.fault is StoreFault.FULL
        yield await DurableCache.open(store, home, keep_secrets=False, log=structlog.get_logger())
