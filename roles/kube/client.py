"""The trio side of the bridge: :class:`Kube`, the one interface the controller and cloud roles use.

Every method crosses to asyncio as a single coroutine. Writes of job status are conflict-safe:
:meth:`Kube.update_status` re-reads and re-applies a pure ``mutate`` function on every 409, so
writers that each own different fields of one object (the controller and the hubs) never lose each
other's changes.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import anyio
import anyio.abc
import msgspec
import outcome
import structlog
import trio
import trio_asyncio
from anyio.streams.memory import MemoryObjectSendStream

from nodetask.backoff import Backoff
from roles.kube import crossing
from roles.kube.aio import MERGE_PATCH, AioApi, log_asyncio_error
from roles.kube.errors import Conflict
from roles.kube.resources import JSON, Resource
from roles.kube.watching import Invalid, Relisted, WatchEvent, list_objects, watch_loop

T = TypeVar("T", bound=msgspec.Struct)
R = TypeVar("R")
Log = structlog.typing.FilteringBoundLogger

_ENCODER = msgspec.json.Encoder()

REQUESTS_IN_FLIGHT: Final = 64
"""Requests handed to aiohttp at once (watches and priority requests aside). Its pool has 100
connections, some held by watches; a request beyond them would wait inside aiohttp as an asyncio
task, costing memory and spending its own timeout while it queues. A hub admitting thousands of
edges at once marks their Nodes at this pace instead."""
PRIORITY_REQUESTS_IN_FLIGHT: Final = 4
"""Requests for a :attr:`~roles.kube.resources.Resource.priority` resource (the leader Lease) handed to
aiohttp at once, besides :data:`REQUESTS_IN_FLIGHT`: a renewal never waits for a slot behind a stage's
thousand Task creates or deletes. (A lease took 29 renewals lost in 9 minutes to such a queue.)"""


class Kube:
    """Typed access to the API server. Obtain one with :func:`open_kube`."""

    def __init__(self, api: AioApi, *, log: Log, cross: crossing.Cross = crossing.call) -> None:
        self._api = api
        self._cross = cross
        self._log = log
        self.conflicts = 0
        """409s met by :meth:`update_status` (a metric)."""
        self.writes = 0
        """Successful writes (a metric)."""
        self._in_flight = anyio.CapacityLimiter(REQUESTS_IN_FLIGHT)
        self._priority = anyio.CapacityLimiter(PRIORITY_REQUESTS_IN_FLIGHT)

    @property
    def server(self) -> str:
        """The API server's URL, as the kubeconfig names it."""
        return self._api.host

    def ca_bundle(self) -> bytes | None:
        """The PEM of the CA the API server is verified with, as the kubeconfig (or the pod's service account)
        names it; None when it names none (the system's roots). Errors: OSError when it cannot be read."""
        if not self._api.ca_file:
            return None
        with open(self._api.ca_file, "rb") as file:
            return file.read()

    def _slots(self, resource: Resource[Any]) -> anyio.CapacityLimiter:
        return self._priority if resource.priority else self._in_flight

    async def _request(
        self, slots: anyio.CapacityLimiter, method: str, path: str, *, grace: float = 0.0, **kwargs: Any
    ) -> bytes:
        # Cancellable while it waits for a slot (nothing has been sent yet); once sent, see `grace`.
        async with slots:
            if grace > 0:
                sent: bytes = await _seen_through(grace, self._cross, self._api.request, method, path, **kwargs)
                return sent
            data: bytes = await self._cross(self._api.request, method, path, **kwargs)
        return data

    async def get(self, resource: Resource[T], name: str, *, namespace: str = "") -> T:
        """One object; :class:`~roles.kube.errors.NotFound` when absent."""
        accept = resource.accept(collection=False)
        return resource.decoder().decode(
            await self._request(self._slots(resource), "GET", resource.path(name, namespace=namespace), accept=accept)
        )

    async def list(
        self,
        resource: Resource[T],
        *,
        label_selector: str = "",
        namespace: str = "",
        field_selector: str = "",
        resource_version: str = "",
    ) -> tuple[list[T], list[Invalid], str]:
        """All objects, the ones that do not decode, and the list's resourceVersion.

        ``resource_version``: at least this recent, from the API server's watch cache (see ``list_objects``).
        """
        async with self._slots(resource):
            listed: tuple[list[T], list[Invalid], str] = await self._cross(
                list_objects,
                self._api,
                resource,
                label_selector=label_selector,
                namespace=namespace,
                field_selector=field_selector,
                resource_version=resource_version,
            )
        return listed

    async def list_raw(self, resource: Resource[Any], *, label_selector: str = "", namespace: str = "") -> bytes:
        """The list as the API server sends it (JSON, every field of every object): for printing, not reading."""
        query = {"labelSelector": label_selector} if label_selector else None
        path = resource.path(namespace=namespace)
        return await self._request(self._slots(resource), "GET", path, query=query, accept=JSON)

    async def create(self, resource: Resource[T], obj: T, *, namespace: str = "") -> T:
        """POST a new object, with its ``apiVersion`` and ``kind`` even where they are the type's defaults.

        (The API types omit defaults, as Go's ``omitempty`` does; the API server refuses to create a
        custom resource without its kind.)
        """
        body = _ENCODER.encode(_typed(obj))
        data = await self._request(self._slots(resource), "POST", resource.path(namespace=namespace), body=body)
        self.writes += 1
        return resource.decoder().decode(data)

    async def replace(self, resource: Resource[T], obj: T, *, subresource: str = "") -> T:
        """PUT the whole object (or its ``status``), conditional on its resourceVersion."""
        meta = obj.metadata  # type: ignore[attr-defined]
        path = resource.path(meta.name, namespace=meta.namespace, subresource=subresource)
        data = await self._request(self._slots(resource), "PUT", path, body=_ENCODER.encode(obj))
        self.writes += 1
        return resource.decoder().decode(data)

    async def merge_patch(
        self,
        resource: Resource[T],
        name: str,
        patch: dict[str, Any],
        *,
        namespace: str = "",
        subresource: str = "",
        grace: float = 0.0,
    ) -> T:
        """JSON merge patch; put ``metadata.resourceVersion`` in ``patch`` to make it conditional.

        With ``grace``, a patch already sent when the caller is cancelled is still awaited for up to
        ``grace`` seconds, so that the caller knows it has landed (or failed) before it moves on; a
        patch still waiting for its turn is dropped at once.
        """
        path = resource.path(name, namespace=namespace, subresource=subresource)
        data = await self._patch(self._slots(resource), path, patch, grace=grace)
        return resource.decoder().decode(data)

    async def merge_patch_raw(
        self, resource: Resource[Any], name: str, patch: dict[str, Any], *, namespace: str = "", subresource: str = ""
    ) -> None:
        """A merge patch whose answer is not decoded: for objects that do not decode into their type."""
        path = resource.path(name, namespace=namespace, subresource=subresource)
        await self._patch(self._slots(resource), path, patch)

    async def _patch(
        self, slots: anyio.CapacityLimiter, path: str, patch: dict[str, Any], *, grace: float = 0.0
    ) -> bytes:
        body = _ENCODER.encode(patch)
        data = await self._request(slots, "PATCH", path, body=body, content_type=MERGE_PATCH, grace=grace)
        self.writes += 1
        return data

    async def delete(self, resource: Resource[Any], name: str, *, namespace: str = "") -> None:
        await self._request(self._slots(resource), "DELETE", resource.path(name, namespace=namespace))

    async def delete_all(self, resource: Resource[Any], *, label_selector: str, namespace: str = "") -> None:
        """Delete every object that ``label_selector`` matches, in one request (a delete collection)."""
        if not label_selector:
            raise ValueError(f"deleting every {resource.plural} needs a label selector")
        query = {"labelSelector": label_selector}
        await self._request(self._slots(resource), "DELETE", resource.path(namespace=namespace), query=query)

    async def update_status(
        self,
        resource: Resource[T],
        name: str,
        mutate: Callable[[T], T | None],
        *,
        attempts: int = 8,
        current: T | None = None,
        namespace: str = "",
    ) -> T | None:
        """Read, apply ``mutate``, write the status; on 409 re-read and re-apply, up to ``attempts`` times.

        ``mutate`` must be pure (it may run several times) and return None when nothing changes, in
        which case nothing is written and the current object is returned. ``current``, a copy the
        caller already holds (e.g. from a watch), saves the first read: a stale copy only costs
        one 409 and a re-read (a decision to write nothing is always taken on a fresh read).
        ``namespace`` is the object's, for a namespaced resource.

        Errors:
            :class:`~roles.kube.errors.NotFound` if the object is gone; the last
            :class:`~roles.kube.errors.Conflict` once the attempts are spent.
        """
        backoff = Backoff(initial=0.02, cap=1.0)
        for attempt in range(1, attempts + 1):
            fresh = current is None
            if current is None:
                current = await self.get(resource, name, namespace=namespace)
            changed = mutate(current)
            if changed is None:
                if not fresh:
                    # "Nothing to change" is only decided on a fresh read, never on the caller's copy.
                    current = None
                    continue
                return current
            try:
                return await self.replace(resource, changed, subresource="status")
            except Conflict:
                self.conflicts += 1
                if attempt == attempts:
                    raise
                current = None
                await anyio.sleep(backoff.delay())
        raise AssertionError("unreachable")

    async def watch(
        self,
        resource: Resource[Any],
        send: MemoryObjectSendStream[WatchEvent],
        *,
        label_selector: str = "",
        namespace: str = "",
        field_selector: str = "",
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Deliver ``resource``'s snapshot and changes to ``send`` until cancelled.

        Ready (``task_status.started()``) once the first snapshot has been delivered. ``send`` must
        be able to take events without blocking (an unbounded memory stream): the asyncio side
        can only hand events over synchronously.
        """
        listed = trio.Event()

        def deliver(event: WatchEvent) -> None:
            try:
                send.send_nowait(event)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return  # the consumer is gone: this watch is being stopped
            if isinstance(event, Relisted):
                listed.set()

        loop = functools.partial(
            watch_loop,
            self._api,
            resource,
            deliver,
            log=self._log,
            label_selector=label_selector,
            namespace=namespace,
            field_selector=field_selector,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._cross, loop)
            await listed.wait()
            task_status.started()


def _typed(obj: msgspec.Struct) -> Any:
    fields = msgspec.to_builtins(obj)
    if isinstance(fields, dict):
        for key, attribute in (("apiVersion", "api_version"), ("kind", "kind")):
            value = getattr(obj, attribute, "")
            if value:
                fields.setdefault(key, value)
    return fields


async def _seen_through(grace: float, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R:
    """``await fn(*args, **kwargs)``, which a cancellation stops only after ``grace`` more seconds.

    The call runs shielded in a task of its own; a cancellation of the caller starts the clock on
    the shield, and the cancellation is re-raised once the call has ended (answered or stopped).
    """
    result: outcome.Outcome[R] | None = None
    shield = anyio.CancelScope(shield=True)
    done = anyio.Event()

    async def run() -> None:
        nonlocal result
        with shield:
            result = await outcome.acapture(fn, *args, **kwargs)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            shield.deadline = anyio.current_time() + grace
            raise
    assert result is not None
    return result.unwrap()


@asynccontextmanager
async def open_kube(*, kubeconfig: str, log: Log, context: str = "") -> AsyncIterator[Kube]:
    """Open the asyncio loop and an API client (of ``context`` in ``kubeconfig``, else its current one); close both
    on exit (even when cancelled)."""
    async with trio_asyncio.open_loop() as loop:
        loop.set_exception_handler(functools.partial(log_asyncio_error, log=log))
        cross = crossing.bound(loop)
        api = await cross(AioApi.connect, kubeconfig, context)
        try:
            yield Kube(api, log=log, cross=cross)
        finally:
            with anyio.move_on_after(5, shield=True):
                try:
                    await cross(api.close)
                except asyncio.CancelledError:
                    # trio-asyncio cancels every asyncio task when the loop's own scope is cancelled
                    # (e.g. a test's teardown); the session is then closed by the loop's shutdown.
                    log.debug("api_close_cancelled")


__all__ = ["Kube", "open_kube"]
