"""Crossing from trio into asyncio so that cancellation always arrives.

Measured here: when trio cancels an ``aio_as_trio`` crossing while the asyncio task is inside aiohttp
(a watch mid-read, a request mid-flight), the asyncio task is sometimes left "cancelling" yet waiting
on a new future forever, and the trio side waits for it forever. So trio never cancels an asyncio
task directly: the crossing runs shielded, and trio's cancellation is turned into an asyncio-side
stop signal; the asyncio side then cancels its own task, which is reliable.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import outcome
import trio
import trio_asyncio

P = ParamSpec("P")
R = TypeVar("R")

STOP_GRACE_S = 10.0
"""How long a stopped asyncio call may take to unwind before trio cancels it the hard way."""


class _Stopped(Exception):
    """The trio side asked the asyncio call to stop."""


async def _stoppable(stop: asyncio.Event, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R:
    task = asyncio.ensure_future(fn(*args, **kwargs))
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    # aiohttp's timeout contexts may uncancel the task and carry on (e.g. into a retry), so keep
    # cancelling until it is really done.
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.05)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()
    raise _Stopped


async def call(fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs) -> R:
    """Await the asyncio coroutine function ``fn(*args, **kwargs)`` from trio, on the current loop.

    Cancellation: a trio cancellation stops the asyncio call cooperatively and waits (up to
    :data:`STOP_GRACE_S`) for it to unwind, then re-raises ``trio.Cancelled``.
    """
    return await _cross(None, fn, *args, **kwargs)


Cross = Callable[..., Coroutine[Any, Any, Any]]
"""The signature of :func:`call`."""


def bound(loop: asyncio.AbstractEventLoop) -> Cross:
    """:func:`call` pinned to ``loop``.

    trio-asyncio picks "the current loop" from a context variable, so a task that opened several
    loops (a test running a controller and two hubs) would otherwise run one client's requests on
    another client's loop, which aiohttp refuses.
    """

    async def call_on(fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R:
        return await _cross(loop, fn, *args, **kwargs)

    return call_on


async def _cross(
    loop: asyncio.AbstractEventLoop | None, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any
) -> R:
    stop = asyncio.Event()
    result: outcome.Outcome[R] | None = None
    finished = trio.Event()
    shield = trio.CancelScope(shield=True)

    async def run() -> None:
        nonlocal result
        with shield:
            result = await outcome.acapture(trio_asyncio.aio_as_trio(_stoppable, loop=loop), stop, fn, *args, **kwargs)
        finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        try:
            await finished.wait()
        except trio.Cancelled:
            stop.set()
            # The shield stays up (lowering it would let the outer cancellation straight in); the
            # scope's own deadline bounds how long the asyncio side may take to unwind.
            shield.deadline = trio.current_time() + STOP_GRACE_S
            raise
    assert result is not None
    return result.unwrap()
