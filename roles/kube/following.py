"""The trio side of a watch: its events handed, in order, to a handler in the caller's task group."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

from roles.kube.watching import Deleted, Relisted, Upserted, WatchEvent

__all__ = ["Handler", "follow", "mirror_by_name"]

Handler = Callable[[WatchEvent], Awaitable[None] | None]
"""Takes one event in; a coroutine (awaited before the next event) or a plain function."""


async def follow(tg: anyio.abc.TaskGroup, watch: Callable[..., Coroutine[Any, Any, object]], handle: Handler) -> None:
    """Run ``watch`` and a consumer handing its events to ``handle``, both in ``tg``, until ``tg`` ends.

    ``watch`` is started with the send end of an unbounded memory stream (``Kube.watch`` with its
    resource and selectors bound). Returns once ``handle`` has taken the first snapshot in, not
    only once the watch has delivered it, so that a caller ready after ``follow`` has its cache filled.
    """
    send, receive = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
    listed = anyio.Event()
    tg.start_soon(_consume, receive, handle, listed)
    await tg.start(watch, send)
    await listed.wait()


async def _consume(events: MemoryObjectReceiveStream[WatchEvent], handle: Handler, listed: anyio.Event) -> None:
    async with events:
        async for event in events:
            pending = handle(event)
            if pending is not None:
                await pending
            if isinstance(event, Relisted):
                listed.set()


def mirror_by_name(cache: dict[str, Any], event: WatchEvent) -> bool:
    """Apply ``event`` to ``cache``, the watched objects by name; whether it was a change of objects
    (not an :class:`~roles.kube.Invalid` or :class:`~roles.kube.Interrupted`)."""
    match event:
        case Relisted(objects=objects):
            cache.clear()
            cache.update((obj.metadata.name, obj) for obj in objects)
        case Upserted(obj=obj):
            cache[obj.metadata.name] = obj
        case Deleted(obj=obj):
            cache.pop(obj.metadata.name, None)
        case _:
            return False
    return True
