"""A controller's watches: each keeps a cache through its handler, and together they say when the
controller may start deciding, which is once every cache holds its first list.

Built on :func:`roles.kube.following.follow` (what the hub's watches use too), which returns once a
handler has taken in its watch's first list; this adds the controllers' own parts: several watches
started in order, and objects that do not decode told to ``on_invalid``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from roles.kube import Invalid, Kube, WatchEvent
from roles.kube.following import Handler
from roles.kube.following import follow as follow_one
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
    """Start each watch and its consumer in ``tg``, in order; return once every consumer has handled its
    first list. In order, because a later cache's handler may read an earlier one's (a Pod's Node)."""
    for watch in watches:
        start = functools.partial(kube.watch, watch.resource, field_selector=watch.field_selector)
        await follow_one(tg, start, _handler(watch, on_invalid))


def _handler(watch: Watch, on_invalid: OnInvalid) -> Handler:
    async def handle(event: WatchEvent) -> None:
        watch.handle(event)
        if isinstance(event, Invalid):
            await on_invalid(watch.resource.plural, event)

    return handle
