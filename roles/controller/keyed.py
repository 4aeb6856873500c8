"""One serial worker per object, woken by pokes that coalesce, as long as the object needs one.

A pass over an object never runs twice at once, and every poke made while a pass runs leads to one
more pass, which reads the newest cached state: so passes can be driven by any mix of watch
events without queueing one pass per event.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import anyio
import anyio.abc
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from roles.kube import ApiError, NotFound
from roles.kube.retrying import Outage

K = TypeVar("K", bound=Hashable)
Log = structlog.typing.FilteringBoundLogger
Pass = Callable[[K], Awaitable[float | None]]
"""One pass over a key: the loop time of the next pass (``math.inf``: only when poked), or None when the
key needs no worker any more (a later poke starts a new one)."""


class KeyedWorkers(Generic[K]):
    """Workers for keys, started in ``workers`` (a task group owning them) once ``ready`` is set.

    Errors: an :class:`~roles.kube.ApiError` from a pass is logged and the pass retried with a
    capped backoff (a NotFound waits for the next poke instead: the object is going away); any
    other error propagates to ``workers``.
    """

    def __init__(self, workers: anyio.abc.TaskGroup, work: Pass[K], *, ready: anyio.Event, log: Log, what: str) -> None:
        self._workers = workers
        self._work = work
        self._ready = ready
        self._log = log
        self._what = what
        self._wake: dict[K, MemoryObjectSendStream[None]] = {}

    def poke(self, key: K) -> None:
        """Make ``key``'s worker pass again, starting one if it has none."""
        wake = self._wake.get(key)
        if wake is None:
            wake, receive = anyio.create_memory_object_stream[None](max_buffer_size=1)
            self._wake[key] = wake
            self._workers.start_soon(self._worker, key, receive, name=f"{self._what} {key}")
        # A full one-slot buffer means a pass is already due: pokes coalesce.
        with contextlib.suppress(anyio.WouldBlock):
            wake.send_nowait(None)

    async def _worker(self, key: K, wake: MemoryObjectReceiveStream[None]) -> None:
        outage = Outage(self._log.bind(what=self._what, key=str(key)), "pass_failed", initial=1.0, cap=30.0)
        await self._ready.wait()
        try:
            async with wake:
                await wake.receive()
                while True:
                    try:
                        due = await self._work(key)
                        outage.recovered()
                    except NotFound:
                        due = math.inf
                    except ApiError as exc:
                        due = anyio.current_time() + outage.failed(exc)
                    if due is None:
                        # Done, unless poked during the pass. No await between this check and the
                        # removal below, so no poke can slip in unseen.
                        try:
                            wake.receive_nowait()
                        except anyio.WouldBlock:
                            return
                        continue
                    with anyio.move_on_after(max(0.0, due - anyio.current_time())):
                        await wake.receive()
        finally:
            del self._wake[key]
