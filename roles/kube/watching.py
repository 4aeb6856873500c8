"""List-then-watch loops, run entirely on the asyncio side of the bridge.

A loop lists the resource, hands trio a :class:`Relisted` snapshot, then watches from the list's
resourceVersion with bookmarks, and hands over each change. A 410 Gone (the version is too old) or a
broken connection leads to a relist after a capped, jittered backoff; the consumer reconciles the
snapshot, so no event is lost across an API server restart. Events reach trio only through the
synchronous ``deliver`` callback (a memory stream's ``send_nowait``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from roles.kube.aio import AioApi, raise_if_cancelling
from roles.kube.errors import ApiError, Gone
from roles.kube.resources import Resource
from roles.kube.retrying import Outage
from schemas.core import Status

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Upserted(Generic[T]):
    """An object was added or changed."""

    obj: T


@dataclass(frozen=True, slots=True)
class Deleted(Generic[T]):
    """An object is gone (its last state)."""

    obj: T


@dataclass(frozen=True, slots=True)
class Relisted(Generic[T]):
    """The complete current set, after the first list and after every relist."""

    objects: tuple[T, ...]
    invalid: tuple[Invalid, ...] = ()
    resource_version: str = ""
    """The list's resourceVersion: the snapshot is the state as of it."""


@dataclass(frozen=True, slots=True)
class Invalid:
    """An object that does not decode into its type: its name and what is wrong."""

    name: str
    error: str
    uid: str = ""
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class Interrupted:
    """Listing or watching failed and is being retried: what was delivered may be stale until the next relist."""

    error: str


WatchEvent = Upserted[Any] | Deleted[Any] | Relisted[Any] | Invalid | Interrupted


class _NamedMeta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""


class _Named(msgspec.Struct):
    metadata: _NamedMeta = msgspec.field(default_factory=_NamedMeta)


class _RawEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _RawList(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] | None = None
    """None in an empty PartialObjectMetadataList (a Go nil slice)."""


_EVENT = msgspec.json.Decoder(_RawEvent)
_LIST = msgspec.json.Decoder(_RawList)
_NAMED = msgspec.json.Decoder(_Named)
_STATUS = msgspec.json.Decoder(Status)


def _decode_item(decoder: msgspec.json.Decoder[Any], raw: msgspec.Raw) -> Any:
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        meta = _NAMED.decode(raw).metadata
        return Invalid(name=meta.name, uid=meta.uid, error=str(exc), namespace=meta.namespace)


async def list_objects(
    api: AioApi,
    resource: Resource[Any],
    *,
    label_selector: str = "",
    namespace: str = "",
    field_selector: str = "",
    resource_version: str = "",
    snapshot: bool = False,
) -> tuple[list[Any], list[Invalid], str]:
    """All objects (valid and not) and the list's resourceVersion, following ``continue`` pages.

    With ``resource_version`` the list is at least that recent and served from the API server's
    watch cache, in one page: a limit would send it to etcd instead, which reads the whole
    collection to filter it (a list of one node's Pods would read every Pod of the cluster).
    With ``snapshot``, items are decoded as a watch's snapshot (``Resource.snapshot_type``), and brought as
    metadata only when the resource says so (``Resource.metadata_only``).
    """
    decoder = resource.snapshot_decoder() if snapshot else resource.decoder()
    accept = resource.accept(collection=True, snapshot=snapshot)
    valid: list[Any] = []
    invalid: list[Invalid] = []
    query = {"resourceVersion": resource_version} if resource_version else {"limit": "500"}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    path = resource.path(namespace=namespace)
    while True:
        page = _LIST.decode(await api.request("GET", path, query=query, accept=accept, timeout_s=60))
        for raw in page.items or ():
            item = _decode_item(decoder, raw)
            (invalid if isinstance(item, Invalid) else valid).append(item)
        if not page.metadata.continue_:
            return valid, invalid, page.metadata.resource_version
        query["continue"] = page.metadata.continue_


async def _watch_once(
    api: AioApi,
    *,
    path: str,
    query: dict[str, str],
    version: str,
    decoder: msgspec.json.Decoder[Any],
    deliver: Callable[[WatchEvent], None],
    read_timeout: float,
    accept: str,
) -> str:
    """One watch request; returns the last resourceVersion seen. Raises Gone on 410."""
    latest = version

    def on_line(line: bytes) -> None:
        nonlocal latest
        event = _EVENT.decode(line)
        if event.type == "ERROR":
            status = _STATUS.decode(event.object)
            if status.code == 410:
                raise Gone(410, status.reason, status.message, what=f"watch {path}")
            raise ApiError(status.code, status.reason, status.message, what=f"watch {path}")
        latest = _NAMED.decode(event.object).metadata.resource_version or latest
        if event.type == "BOOKMARK":
            return
        item = _decode_item(decoder, event.object)
        if isinstance(item, Invalid):
            deliver(item)
        elif event.type == "DELETED":
            deliver(Deleted(item))
        else:
            deliver(Upserted(item))

    await api.stream(path, query=query, read_timeout=read_timeout, on_line=on_line, accept=accept)
    return latest


async def watch_loop(
    api: AioApi,
    resource: Resource[Any],
    deliver: Callable[[WatchEvent], None],
    *,
    log: Any,
    label_selector: str = "",
    namespace: str = "",
    field_selector: str = "",
    watch_timeout: int = 290,
) -> None:
    """List, deliver the snapshot, watch and deliver changes; forever, relisting when needed.

    Any failure (an API server restarting answers 401, 403, a plain 404, 429, 5xx or nothing at all)
    is retried with backoff, logged once per outage (``watch_failed``) and ended by a relist.
    Cancellation: cancel the asyncio task (trio does so when the crossing coroutine is cancelled).
    """
    outage = Outage(log.bind(resource=resource.plural), "watch_failed", initial=0.5, cap=30.0)
    decoder = resource.decoder()
    path = resource.path(namespace=namespace)
    version = ""
    while True:
        try:
            if not version:
                valid, invalid, version = await list_objects(
                    api,
                    resource,
                    label_selector=label_selector,
                    namespace=namespace,
                    field_selector=field_selector,
                    snapshot=True,
                )
                deliver(Relisted(tuple(valid), tuple(invalid), resource_version=version))
                outage.recovered()
            query = {
                "watch": "1",
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(watch_timeout),
            }
            if label_selector:
                query["labelSelector"] = label_selector
            if field_selector:
                query["fieldSelector"] = field_selector
            version = await _watch_once(
                api,
                path=path,
                query=query,
                version=version,
                decoder=decoder,
                deliver=deliver,
                read_timeout=watch_timeout + 30,
                accept=resource.accept(collection=False),
            )
        except Gone:
            log.info("watch_relist", resource=resource.plural, reason="resource version too old")
            version = ""
        except (ApiError, msgspec.DecodeError) as exc:
            raise_if_cancelling()
            delay = outage.failed(exc)
            deliver(Interrupted(str(exc)))
            version = ""
            await asyncio.sleep(delay)
