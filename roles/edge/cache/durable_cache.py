"""The device's cache of its node's cloud objects, kept in the edge store and served to the local API.

The hub feeds it (:class:`~nodetask.messages.CacheObjects`, :class:`~nodetask.messages.CacheDeleted`);
the local API reads it through :class:`~roles.edge.cache.view.CacheView`. The rules are
:class:`~roles.edge.cache.view.MemoryCache`'s, made durable (:mod:`roles.edge.store.cache_rows`): an older
resource version never overwrites a newer one, a deletion older than the cached object is ignored,
and a fresh list replaces a kind's collection in one transaction. Every change is announced to the
subscribers once it is committed.

Every write that fails - the store cannot take it (a full disk, an I/O error) or the object cannot
be stored (no numeric resource version) - puts the keys it concerned in the error-key ledger
(:mod:`roles.edge.cache.ledger`) with the reason; a later write of a key that succeeds takes it out. A
failed replacement errs every key it would have touched: those listed, and those cached that it
would have removed (the repair loop then learns from the hub that they are gone).

A replace too large for one frame comes in chunks (:class:`~nodetask.messages.CacheChunk`, the rule
is :func:`nodetask.cache_chunks.step`): each is staged in the store apart from the collection, and the
last one swaps the collection for all of them in one transaction. A chunk out of place, a new session
or a restart drops what was staged, so a replace cut short leaves the collection as it was, never
half replaced.

Secrets are kept only when ``keep_secrets`` (``localApi.serveSecrets``): otherwise the hub is not
told the edge takes them, any it sends anyway are refused, and those cached under an earlier
configuration are purged when the cache opens.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, final

import anyio
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from nodetask import cache_chunks
from nodetask.cache_chunks import Progress, Step
from nodetask.messages import CacheChunk, CacheDeleted, CacheKey, CacheObjects
from roles.edge.cache.kinds import RESOURCES
from roles.edge.cache.ledger import Ledger
from roles.edge.cache.view import Change, ChangeType, Listing, Object, Subscribers, object_key, resource_version
from roles.edge.store.cache_rows import Key, Replacement, Row, Written
from roles.edge.store.store import EdgeStore, StoreError

__all__ = ["KINDS", "SECRET", "STREAMED", "DurableCache"]

Log = structlog.typing.FilteringBoundLogger

KINDS: Final = frozenset(resource.kind for resource in RESOURCES.values())
"""What a node may cache (Kubernetes' Node authorizer rule): its Node, its Pods, and their ConfigMaps and
Secrets; and what its kubelet reads through the device besides (its Lease, Services)."""
STREAMED: Final = frozenset(resource.kind for resource in RESOURCES.values() if resource.streamed)
"""What the hub's cache streams send (and relist after every Welcome)."""
SECRET: Final = "Secret"

_decode: Final = msgspec.json.Decoder(dict[str, Any]).decode


class _KeyMeta(msgspec.Struct):
    name: Any = None
    namespace: Any = ""
    resourceVersion: Any = None


class _Keyed(msgspec.Struct):
    """Only what a row needs of an object: reading the rest into Python objects would take four times as long."""

    metadata: _KeyMeta | None = None


_keyed: Final = msgspec.json.Decoder(_Keyed).decode


def _key_fields(raw: msgspec.Raw) -> Object:
    """``raw``'s name, namespace and resource version as ``metadata`` (for :func:`object_key` and
    :func:`resource_version`, whose checks and messages stay theirs). Errors: msgspec.DecodeError."""
    meta = _keyed(raw).metadata
    if meta is None:
        return {}
    return {"metadata": {"name": meta.name, "namespace": meta.namespace, "resourceVersion": meta.resourceVersion}}


def _deleted_at(body: bytes, version: int) -> Object:
    """The object's last state, as a DELETED event carries it: at the deletion's resource version."""
    obj = _decode(body)
    return {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": str(version)}}


def _change(written: Written) -> Change:
    obj = _decode(written.row.body)
    if written.previous is None:
        return Change(ChangeType.ADDED, obj)
    return Change(ChangeType.MODIFIED, obj, _decode(written.previous))


@dataclass(slots=True)
class _Staging:
    """A replace in chunks under way: what its chunks so far held that cannot be stored or be sent."""

    failed: dict[CacheKey, str] = field(default_factory=dict)
    """Keys of objects that cannot be stored, with why."""
    kept: set[Key] = field(default_factory=set)
    broken: str = ""
    """Why staging a chunk failed (the replace cannot complete: its keys are errored instead)."""


@final
class DurableCache:
    """A :class:`~roles.edge.cache.view.CacheView` over the edge store, fed by the hub.

    Make one with :meth:`open`.

    Writes are applied one message at a time, in arrival order; reads may run alongside.
    """

    def __init__(self, store: EdgeStore, ledger: Ledger, *, keep_secrets: bool, log: Log) -> None:
        self._store = store
        self.ledger = ledger
        self.keep_secrets = keep_secrets
        self._log = log
        self._subscribers = Subscribers()
        self._writing = anyio.Lock()
        self._progress: dict[str, Progress] = {}
        """Where the last replace in chunks of each kind stands."""
        self._staging: dict[str, _Staging] = {}

    @classmethod
    async def open(cls, store: EdgeStore, data_dir: Path, *, keep_secrets: bool, log: Log) -> DurableCache:
        """The cache in ``store``, with its ledger in ``data_dir``; Secrets purged unless ``keep_secrets``."""
        cache = cls(store, await Ledger.open(data_dir, log=log), keep_secrets=keep_secrets, log=log)
        if not keep_secrets:
            await cache._purge_secrets()
        await cache.drop_staging()  # what a previous run staged: its session is over
        return cache

    async def _purge_secrets(self) -> None:
        try:
            purged = await self._store.cache_purge(SECRET)
        except StoreError as exc:
            # Not served (the local API refuses Secrets without serveSecrets) and never updated; the
            # next start tries again.
            self._log.error("cache_secrets_not_purged", error=str(exc))
            return
        if purged:
            self._log.warning("cache_secrets_purged", secrets=purged, hint="localApi.serveSecrets is off")
        await self.ledger.update(cleared=[key for key in self.ledger.errors if key.kind == SECRET])

    # -------------------------------------------------------------------------------- CacheView

    async def get(self, kind: str, namespace: str, name: str) -> Object | None:
        body = await self._store.cache_get(kind, namespace, name)
        return None if body is None else _decode(body)

    async def list(self, kind: str, namespace: str) -> Listing:
        bodies, version = await self._store.cache_list(kind, namespace)
        return Listing(items=[_decode(body) for body in bodies], resource_version=str(version))

    def subscribe(self, kind: str) -> AbstractContextManager[MemoryObjectReceiveStream[Change]]:
        return self._subscribers.subscribe(kind)

    # ------------------------------------------------------------------------------------ writes

    async def apply(self, msg: CacheObjects) -> bool:
        """Store the objects of ``msg`` (upserts, or its kind's whole collection with ``replace``).

        Returns whether they were stored; when not, the ledger says which keys failed and why.
        """
        if not self._takes(msg.kind, len(msg.objects)):
            return False
        rows, failed = self._rows(msg.kind, msg.objects)
        async with self._writing:
            if msg.replace:
                self._give_up(msg.kind)  # the store drops what was staged for it with the swap
                swap = functools.partial(self._store.cache_replace, msg.kind, rows, _version(msg.resource_version))
                return await self._replace(msg.kind, swap, rows, failed, staged=False)
            return await self._upsert(msg.kind, rows, failed)

    async def apply_chunk(self, chunk: CacheChunk) -> bool:
        """Take one chunk of a replace sent in parts: stage it, or, the last one, swap its kind's collection
        for every part of the replace in one transaction. A chunk out of place gives its replace up.

        Returns whether ``chunk`` ended a replace: the collection was swapped, or, if that failed (or a
        chunk could not be staged), the ledger says which keys failed and why.
        """
        kind = chunk.kind
        if not self._takes(kind, len(chunk.objects)):
            return False
        rows, failed = self._rows(kind, chunk.objects)
        async with self._writing:
            before = self._progress.get(kind)
            self._progress[kind], verdict = cache_chunks.step(before, chunk)
            if verdict is Step.DROP:
                await self._unstage(kind, chunk, before)
                return False
            first = chunk.seq == 0
            staging = _Staging() if first else self._staging[kind]
            self._staging[kind] = staging
            staging.failed.update(failed)
            staging.kept.update((key.namespace, key.name) for key in chunk.kept)
            if verdict is Step.STAGE:
                await self._stage(kind, rows, staging, first=first)
                return False
            del self._staging[kind]
            if staging.broken:
                with contextlib.suppress(StoreError):
                    await self._store.cache_unstage(kind)
                await self.ledger.update(failed={**_failed(kind, rows, staging.broken), **staging.failed})
                return True
            version, keep = _version(chunk.resource_version), frozenset(staging.kept)
            swap = functools.partial(self._store.cache_replace_staged, kind, rows, version, keep, first=first)
            return await self._replace(kind, swap, rows, staging.failed, staged=not first)

    async def drop_staging(self) -> None:
        """Forget every replace in chunks under way, and what was staged for them (a session is over: their
        other chunks will not come)."""
        async with self._writing:
            self._progress.clear()
            self._staging.clear()
            try:
                dropped = await self._store.cache_unstage()
            except StoreError as exc:
                # Left in the store, unread: the next replace in chunks of each kind takes its place.
                self._log.warning("cache_staging_not_dropped", error=str(exc))
                return
            if dropped:
                self._log.info("cache_staging_dropped", objects=dropped)

    def _takes(self, kind: str, count: int) -> bool:
        if kind not in KINDS:
            self._log.warning("cache_kind_refused", kind=kind, objects=count)
            return False
        if kind == SECRET and not self.keep_secrets:
            self._log.warning("cache_secrets_refused", objects=count, hint="localApi.serveSecrets is off")
            return False
        return True

    def _give_up(self, kind: str) -> None:
        """Chunks of the replace under way for ``kind``, if any, no longer count (a newer replace came)."""
        progress = self._progress.get(kind)
        if progress is not None and progress.open:
            self._progress[kind] = Progress(progress.replace, progress.next, open=False)
        self._staging.pop(kind, None)

    async def _stage(self, kind: str, rows: tuple[Row, ...], staging: _Staging, *, first: bool) -> None:
        if staging.broken:
            await self.ledger.update(failed={**_failed(kind, rows, staging.broken), **staging.failed})
            return
        try:
            await self._store.cache_stage(kind, rows, first=first)
        except StoreError as exc:
            # The replace cannot complete: every key it would touch is errored, those of its chunks
            # still to come too, and the repair loop asks for each.
            staging.broken = str(exc)
            touched = {(row.namespace, row.name) for row in rows}
            with contextlib.suppress(StoreError):
                touched.update(await self._store.cache_keys(kind))
                if not first:
                    touched.update(await self._store.cache_staged_keys(kind))
            reasons = {CacheKey(kind=kind, namespace=ns, name=name): staging.broken for ns, name in touched}
            await self.ledger.update(failed={**reasons, **staging.failed})

    async def _unstage(self, kind: str, chunk: CacheChunk, before: Progress | None) -> None:
        self._staging.pop(kind, None)
        if before is not None and before.replace == chunk.replace and not before.open:
            return  # its replace was given up or done already: said then
        self._log.warning(
            "cache_chunk_out_of_place",
            kind=kind,
            replace=chunk.replace,
            seq=chunk.seq,
            expected=None if before is None or not before.open else f"{before.replace}/{before.next}",
        )
        try:
            await self._store.cache_unstage(kind)
        except StoreError as exc:
            self._log.warning("cache_staging_not_dropped", kind=kind, error=str(exc))

    async def apply_deleted(self, msg: CacheDeleted) -> bool:
        """Take out the object ``msg`` names (unless the cache holds a newer version); whether that worked."""
        key, text = msg.key, msg.resource_version
        if text and not (text.isascii() and text.isdecimal()):
            self._log.warning("cache_deletion_unreadable", key=str(key), resource_version=text)
            return False
        async with self._writing:
            try:
                deletion = await self._store.cache_delete(
                    key.kind, key.namespace, key.name, int(text) if text else None
                )
            except StoreError as exc:
                await self.ledger.update(failed={key: f"cannot delete: {exc}"})
                return False
            if not deletion.stale:
                await self.ledger.update(cleared=[key])
            if deletion.removed is not None:
                self._subscribers.publish(
                    key.kind, Change(ChangeType.DELETED, _deleted_at(deletion.removed, deletion.version))
                )
            return True

    def _rows(self, kind: str, objects: Sequence[msgspec.Raw]) -> tuple[tuple[Row, ...], dict[CacheKey, str]]:
        """The storable ``objects``, and the keys of those that cannot be stored, with why."""
        rows: builtins.list[Row] = []
        failed: dict[CacheKey, str] = {}
        for raw in objects:
            try:
                obj = _key_fields(raw)
                namespace, name = object_key(obj)
            except (msgspec.DecodeError, ValueError) as exc:
                # Without a name there is no key to record or to ask for again.
                self._log.warning("cache_object_unreadable", kind=kind, error=str(exc))
                continue
            try:
                rows.append(Row(namespace, name, resource_version(obj), bytes(raw)))
            except ValueError as exc:
                failed[CacheKey(kind=kind, namespace=namespace, name=name)] = f"cannot store: {exc}"
        return tuple(rows), failed

    async def _upsert(self, kind: str, rows: tuple[Row, ...], failed: dict[CacheKey, str]) -> bool:
        try:
            results = await self._store.cache_upsert(kind, rows)
        except StoreError as exc:
            failed.update({CacheKey(kind=kind, namespace=r.namespace, name=r.name): str(exc) for r in rows})
            await self.ledger.update(failed=failed)
            return False
        written = [result for result in results if isinstance(result, Written)]
        # A key the cache already holds at this very version is as repaired as one written now: a relist
        # that failed errs every cached key, and the repair loop's fetch brings most of them back unchanged.
        cleared = [
            CacheKey(kind=kind, namespace=row.namespace, name=row.name)
            for row, result in zip(rows, results, strict=True)
            if isinstance(result, Written) or not result.stale
        ]
        await self.ledger.update(failed=failed, cleared=cleared)
        for result in written:
            self._subscribers.publish(kind, _change(result))
        return not failed

    async def _replace(
        self,
        kind: str,
        swap: Callable[[], Awaitable[Replacement]],
        rows: tuple[Row, ...],
        failed: dict[CacheKey, str],
        *,
        staged: bool,
    ) -> bool:
        """Swap the collection of ``kind`` (``swap``, for ``rows`` and, when ``staged``, the chunks staged)."""
        try:
            replacement = await swap()
        except StoreError as exc:
            touched = {(row.namespace, row.name) for row in rows}
            # Reading usually works on a full disk; if not, the listed keys are errored and the
            # cached ones are looked at again with the next relist.
            with contextlib.suppress(StoreError):
                touched.update(await self._store.cache_keys(kind))
                if staged:
                    touched.update(await self._store.cache_staged_keys(kind))
                    await self._store.cache_unstage(kind)
            failed.update({CacheKey(kind=kind, namespace=ns, name=name): str(exc) for ns, name in touched})
            await self.ledger.update(failed=failed)
            return False
        # The collection is now as fresh as a list makes it: every key of the kind is repaired.
        await self.ledger.update(failed=failed, cleared=[key for key in self.ledger.errors if key.kind == kind])
        for body in replacement.removed:
            self._subscribers.publish(kind, Change(ChangeType.DELETED, _deleted_at(body, replacement.version)))
        for result in replacement.written:
            self._subscribers.publish(kind, _change(result))
        return not failed


def _version(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdecimal() else None


def _failed(kind: str, rows: Sequence[Row], reason: str) -> dict[CacheKey, str]:
    return {CacheKey(kind=kind, namespace=row.namespace, name=row.name): reason for row in rows}
