"""A controller's watches: each keeps a cache through its handler, and together they say when the
controller may start deciding, which is once every cache holds its first list.

:meth:`~roles.kube.Kube.watch` is ready once its first list is in the stream; a decision needs it
handled, so each stream's consumer marks its watch listed only after handling the first Relisted.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

from roles.kube import Invalid, Kube, Relisted, WatchEvent
from roles.kube.resources import Resource

__all__ = ["OnInvalid", "Watch", "follow"]

OnInvalid = Callable[[str, Invalid], Awaitable[None]]
"""Told of each object that does not decode (after the handler saw it), with its resource's plural."""


@dataclass(frozen=True, slots=True)
class Watch:
    """One watched resource and the handler that keeps its cache (synchronous: a cache never waits)."""

    resource: Resource[Any]
    handle: Callable[[WatchEvent], None]
    field_selector: str = ""


async def follow(tg: anyio.abc.TaskGroup, kube: Kube, watches: Sequence[Watch], *, on_invalid: OnInvalid) -> None:
    """Start each watch and its consumer in ``tg``; return once every consumer has handled its first list."""
    listed: list[anyio.Event] = []
    for watch in watches:
        send, receive = anyio.create_memory_object_stream[WatchEvent](max_buffer_size=math.inf)
        listed.append(anyio.Event())
        tg.start_soon(_consume, receive, watch, listed[-1], on_invalid)
        await tg.start(functools.partial(kube.watch, watch.resource, send, field_selector=watch.field_selector))
    for event in listed:
        await event.wait()


async def _consume(
    events: MemoryObjectReceiveStream[WatchEvent], watch: Watch, listed: anyio.Event, on_invalid: OnInvalid
) -> None:
    async with events:
        async for event in events:
            watch.handle(event)
            if isinstance(event, Relisted):
                listed.set()
            elif isinstance(event, Invalid):
                await on_invalid(watch.resource.plural, event)
