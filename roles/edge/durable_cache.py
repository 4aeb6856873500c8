"""The device's cache of its node's cloud objects, kept in the edge store and served to the local API.

The hub feeds it (:class:`~nodetask.messages.CacheObjects`, :class:`~nodetask.messages.CacheDeleted`);
the local API reads it through :class:`~roles.edge.cache_view.CacheView`. The rules are
:class:`~roles.edge.cache_view.MemoryCache`'s, made durable (:mod:`roles.edge.cache_rows`): an older
resource version never overwrites a newer one, a deletion older than the cached object is ignored,
and a fresh list replaces a kind's collection in one transaction. Every change is announced to the
subscribers once it is committed.

Every write that fails - the store cannot take it (a full disk, an I/O error) or the object cannot
be stored (no numeric resource version) - puts the keys it concerned in the error-key ledger
(:mod:`roles.edge.ledger`) with the reason; a later write of a key that succeeds takes it out. A
failed replacement errs every key it would have touched: those listed, and those cached that it
would have removed (the repair loop then learns from the hub that they are gone).

Secrets are kept only when ``keep_secrets`` (``localApi.serveSecrets``): otherwise the hub is not
told the edge takes them, any it sends anyway are refused, and those cached under an earlier
configuration are purged when the cache opens.
"""

from __future__ import annotations

import builtins
import contextlib
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Final, final

import anyio
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from nodetask.messages import CacheDeleted, CacheKey, CacheObjects
from roles.edge.cache_rows import Row, Written
from roles.edge.cache_view import Change, ChangeType, Listing, Object, Subscribers, object_key, resource_version
from roles.edge.ledger import Ledger
from roles.edge.local_api_paths import RESOURCES
from roles.edge.store import EdgeStore, StoreError

__all__ = ["KINDS", "SECRET", "DurableCache"]

Log = structlog.typing.FilteringBoundLogger

KINDS: Final = frozenset(resource.kind for resource in RESOURCES.values())
"""What a node may cache (Kubernetes' Node authorizer rule): its Node, its Pods, and their ConfigMaps and Secrets."""
SECRET: Final = "Secret"

_decode: Final = msgspec.json.Decoder(dict[str, Any]).decode


def _deleted_at(body: bytes, version: int) -> Object:
    """The object's last state, as a DELETED event carries it: at the deletion's resource version."""
    obj = _decode(body)
    return {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": str(version)}}


def _change(written: Written) -> Change:
    obj = _decode(written.row.body)
    if written.previous is None:
        return Change(ChangeType.ADDED, obj)
    return Change(ChangeType.MODIFIED, obj, _decode(written.previous))


@final
class DurableCache:
    """A :class:`~roles.edge.cache_view.CacheView` over the edge store, fed by the hub. Make one with :meth:`open`.

    Writes are applied one message at a time, in arrival order; reads may run alongside.
    """

    def __init__(self, store: EdgeStore, ledger: Ledger, *, keep_secrets: bool, log: Log) -> None:
        self._store = store
        self.ledger = ledger
        self.keep_secrets = keep_secrets
        self._log = log
        self._subscribers = Subscribers()
        self._writing = anyio.Lock()

    @classmethod
    async def open(cls, store: EdgeStore, data_dir: Path, *, keep_secrets: bool, log: Log) -> DurableCache:
        """The cache in ``store``, with its ledger in ``data_dir``; Secrets purged unless ``keep_secrets``."""
        cache = cls(store, await Ledger.open(data_dir, log=log), keep_secrets=keep_secrets, log=log)
        if not keep_secrets:
            await cache._purge_secrets()
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
        if msg.kind not in KINDS:
            self._log.warning("cache_kind_refused", kind=msg.kind, objects=len(msg.objects))
            return False
        if msg.kind == SECRET and not self.keep_secrets:
            self._log.warning("cache_secrets_refused", objects=len(msg.objects), hint="localApi.serveSecrets is off")
            return False
        rows, failed = self._rows(msg)
        async with self._writing:
            if msg.replace:
                return await self._replace(msg.kind, rows, msg.resource_version, failed)
            return await self._upsert(msg.kind, rows, failed)

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

    def _rows(self, msg: CacheObjects) -> tuple[tuple[Row, ...], dict[CacheKey, str]]:
        """The storable objects of ``msg``, and the keys of those that cannot be stored, with why."""
        rows: builtins.list[Row] = []
        failed: dict[CacheKey, str] = {}
        for raw in msg.objects:
            try:
                obj = _decode(raw)
                namespace, name = object_key(obj)
            except (msgspec.DecodeError, ValueError) as exc:
                # Without a name there is no key to record or to ask for again.
                self._log.warning("cache_object_unreadable", kind=msg.kind, error=str(exc))
                continue
            try:
                rows.append(Row(namespace, name, resource_version(obj), bytes(raw)))
            except ValueError as exc:
                failed[CacheKey(kind=msg.kind, namespace=namespace, name=name)] = f"cannot store: {exc}"
        return tuple(rows), failed

    async def _upsert(self, kind: str, rows: tuple[Row, ...], failed: dict[CacheKey, str]) -> bool:
        try:
            results = await self._store.cache_upsert(kind, rows)
        except StoreError as exc:
            failed.update({CacheKey(kind=kind, namespace=r.namespace, name=r.name): str(exc) for r in rows})
            await self.ledger.update(failed=failed)
            return False
        written = [result for result in results if result is not None]
        cleared = [CacheKey(kind=kind, namespace=w.row.namespace, name=w.row.name) for w in written]
        await self.ledger.update(failed=failed, cleared=cleared)
        for result in written:
            self._subscribers.publish(kind, _change(result))
        return not failed

    async def _replace(self, kind: str, rows: tuple[Row, ...], text: str, failed: dict[CacheKey, str]) -> bool:
        version = int(text) if text.isascii() and text.isdecimal() else None
        try:
            replacement = await self._store.cache_replace(kind, rows, version)
        except StoreError as exc:
            touched = {(row.namespace, row.name) for row in rows}
            # Reading usually works on a full disk; if not, the listed keys are errored and the
            # cached ones are looked at again with the next relist.
            with contextlib.suppress(StoreError):
                touched.update(await self._store.cache_keys(kind))
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
