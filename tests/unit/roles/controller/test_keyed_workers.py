"""Keyed workers: one pass at a time per key, pokes that coalesce, deadlines as timeouts, retries on API errors."""

from __future__ import annotations

import math

import anyio
import structlog
import trio.testing

from roles.controller.keyed import KeyedWorkers
from roles.kube import ApiError


async def test_pokes_during_a_pass_coalesce_into_one_more_pass(autojump_clock: trio.testing.MockClock) -> None:
    """Ten pokes while a pass runs lead to exactly one more pass, never two passes of a key at once."""
    ready = anyio.Event()
    running: set[str] = set()
    passes: list[str] = []

    async def work(key: str) -> float | None:
        assert key not in running
        running.add(key)
        passes.append(key)
        await anyio.sleep(1)
        running.discard(key)
        return None

    async with anyio.create_task_group() as tg:
        workers = KeyedWorkers(tg, work, ready=ready, log=structlog.get_logger(), what="test")
        workers.poke("a")
        ready.set()
        await anyio.sleep(0.5)
        for _ in range(10):
            workers.poke("a")
        workers.poke("b")
    assert sorted(passes) == ["a", "a", "b"]


async def test_a_pass_runs_again_at_its_deadline_or_when_poked(autojump_clock: trio.testing.MockClock) -> None:
    """A pass returning a loop time runs again then; math.inf waits for a poke; None ends the worker."""
    ready = anyio.Event()
    ready.set()
    times: list[float] = []
    answers = [anyio.current_time() + 5, math.inf, None]

    async def work(key: str) -> float | None:
        times.append(anyio.current_time())
        return answers.pop(0)

    async with anyio.create_task_group() as tg:
        workers = KeyedWorkers(tg, work, ready=ready, log=structlog.get_logger(), what="test")
        workers.poke("a")
        await anyio.sleep(20)
        workers.poke("a")
    assert times == [0, 5, 20]


async def test_an_api_error_is_retried_with_backoff(autojump_clock: trio.testing.MockClock) -> None:
    """A pass failing with an API error runs again after a backoff of about a second, then succeeds."""
    ready = anyio.Event()
    ready.set()
    times: list[float] = []

    async def work(key: str) -> float | None:
        times.append(anyio.current_time())
        if len(times) == 1:
            raise ApiError(500, "InternalError", "etcd is away")
        return None

    async with anyio.create_task_group() as tg:
        KeyedWorkers(tg, work, ready=ready, log=structlog.get_logger(), what="test").poke("a")
    assert len(times) == 2
    assert 0.5 <= times[1] - times[0] <= 2
