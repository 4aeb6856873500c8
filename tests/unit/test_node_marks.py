"""Node marks: a patch waits its turn as long as its caller does, and a cancelled one is dropped or seen through."""

from __future__ import annotations

import functools
from typing import Any, cast

import anyio
import pytest
import structlog
import trio.testing
from prometheus_client import CollectorRegistry

from nodetask.clock import Clock
from roles.cloud.hub import Hub, HubSettings
from roles.cloud.metrics import HubMetrics
from roles.jobtypes import job_types
from roles.kube import Kube
from roles.kube.aio import AioApi
from roles.kube.client import REQUESTS_IN_FLIGHT
from roles.kube.resources import NODES

NODE = b'{"metadata": {"name": "n1"}}'


class SlowApi:
    """An API server whose every answer takes ``latency`` seconds; it records the PATCHes it answered."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.sent: list[str] = []
        self.answered: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> bytes:
        self.sent.append(path)
        await anyio.sleep(self.latency)
        self.answered.append(path)
        return NODE


async def _direct(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await fn(*args, **kwargs)


def _kube(api: SlowApi) -> Kube:
    return Kube(cast("AioApi", api), log=structlog.get_logger(), cross=_direct)


async def test_a_patch_waits_for_its_turn_however_long_the_queue(autojump_clock: trio.testing.MockClock) -> None:
    """Thousands of patches queued behind the in-flight limit all go through, each after its turn."""
    api = SlowApi(latency=1.0)
    kube = _kube(api)
    async with anyio.create_task_group() as tg:
        for i in range(REQUESTS_IN_FLIGHT * 40):
            tg.start_soon(functools.partial(kube.merge_patch, NODES, f"n{i}", {}, grace=5.0))
    assert len(api.answered) == REQUESTS_IN_FLIGHT * 40
    assert anyio.current_time() >= 40.0  # the last waited 39 s for its turn, far past the grace


async def test_a_cancelled_patch_still_waiting_for_its_turn_is_never_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancelled before a slot frees up, a patch is dropped at once without reaching the API server."""
    api = SlowApi(latency=10.0)
    kube = _kube(api)
    async with anyio.create_task_group() as busy:
        for i in range(REQUESTS_IN_FLIGHT):
            busy.start_soon(kube.merge_patch, NODES, f"busy{i}", {})
        await trio.testing.wait_all_tasks_blocked()
        with anyio.move_on_after(1.0):
            await kube.merge_patch(NODES, "queued", {}, grace=5.0)
        assert anyio.current_time() == pytest.approx(1.0)
    assert "/api/v1/nodes/queued" not in api.sent


async def test_a_cancelled_patch_already_sent_is_awaited_within_its_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A patch in flight when its caller is cancelled gets its answer before the cancellation goes on."""
    api = SlowApi(latency=3.0)
    kube = _kube(api)
    with anyio.move_on_after(1.0) as scope:
        await kube.merge_patch(NODES, "n1", {}, grace=5.0)
    assert scope.cancelled_caught
    assert api.answered == ["/api/v1/nodes/n1"]
    assert anyio.current_time() == pytest.approx(3.0)


async def test_a_sent_patch_outliving_its_grace_is_stopped(autojump_clock: trio.testing.MockClock) -> None:
    """The grace counts from the cancellation, and a patch still unanswered at its end is stopped."""
    api = SlowApi(latency=60.0)
    kube = _kube(api)
    with anyio.move_on_after(1.0):
        await kube.merge_patch(NODES, "n1", {}, grace=5.0)
    assert api.answered == []
    assert anyio.current_time() == pytest.approx(6.0)


def _hub(kube: Kube | None, registry: CollectorRegistry, **settings: Any) -> Hub:
    return Hub(
        kube=cast("Kube", kube),
        clock=Clock.start(),
        log=structlog.get_logger(),
        settings=HubSettings(hub_id="h", **settings),
        job_types=job_types(),
        metrics=HubMetrics(registry, sessions=lambda: 0, kube=lambda: (0, 0)),
    )


async def test_every_mark_of_a_connect_storm_lands_however_long_it_queues(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A thousand sessions admitted at once all get their Node marked, though most wait past closeGrace."""
    api = SlowApi(latency=1.0)
    hub = _hub(_kube(api), CollectorRegistry(), close_grace=2.0)
    async with anyio.create_task_group() as tg:
        for i in range(1000):
            tg.start_soon(hub._admit, f"n{i}", "v1", structlog.get_logger())
    assert len(api.answered) == 1000
