"""Node marks: a patch waits its turn as long as its caller does, and a stuck mark makes the hub unready."""

from __future__ import annotations

import functools
from typing import Any, cast

import anyio
import pytest
import structlog
import structlog.testing
import trio.testing
from prometheus_client import CollectorRegistry

from nodetask.clock import Clock
from roles.cloud.hub import Hub, HubSettings
from roles.cloud.marks import PendingMarks
from roles.cloud.metrics import HubMetrics
from roles.http import Request, health_routes, router
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


async def test_pending_marks_count_each_and_age_the_oldest(autojump_clock: trio.testing.MockClock) -> None:
    """The book counts marks under way and how long the one begun first has waited, until it ends."""
    marks = PendingMarks(anyio.current_time)
    assert (len(marks), marks.oldest_age()) == (0, 0.0)
    with marks.pending():
        await anyio.sleep(5)
        with marks.pending():
            await anyio.sleep(2)
            assert (len(marks), marks.oldest_age()) == (2, 7.0)
        assert len(marks) == 1
    assert (len(marks), marks.oldest_age()) == (0, 0.0)


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
    assert len(hub.marks) == 0


@pytest.fixture
async def hub() -> tuple[Hub, CollectorRegistry]:
    """A hub that looks started (its caches synced, port bound), with a 60 s markPendingLimit, and its metrics."""
    registry = CollectorRegistry()
    hub = _hub(None, registry, mark_pending_limit=60.0)
    hub.jobs.synced.set()
    hub.tasks.synced.set()
    hub.port = 1
    return hub, registry


async def test_a_mark_pending_past_its_limit_makes_the_hub_unready_saying_why(
    hub: tuple[Hub, CollectorRegistry], autojump_clock: trio.testing.MockClock
) -> None:
    """/readyz answers 503 naming the stuck marks while one has waited past markPendingLimit, then 200."""
    the_hub, _ = hub
    handle = router(
        health_routes(ready=the_hub.ready, why_not_ready=the_hub.why_not_ready, registry=CollectorRegistry())
    )
    readyz = Request(method="GET", path="/readyz", query="", headers=(), body=b"")
    with the_hub.marks.pending():
        await anyio.sleep(59)
        assert (await handle(readyz)).status == 200
        await anyio.sleep(2)
        answer = await handle(readyz)
        assert answer.status == 503
        assert (
            answer.body.decode().strip() == "Node marks stuck: 1 pending, the oldest for 61 s (markPendingLimit 60 s)"
        )
    assert (await handle(readyz)).status == 200


async def test_pending_marks_are_gauges(
    hub: tuple[Hub, CollectorRegistry], autojump_clock: trio.testing.MockClock
) -> None:
    """The hub's metrics show how many marks are pending and the oldest one's age."""
    the_hub, registry = hub
    with the_hub.marks.pending():
        await anyio.sleep(1)
        with the_hub.marks.pending():
            await anyio.sleep(2)
            assert registry.get_sample_value("nodetaskd_hub_node_marks_pending") == 2
            assert registry.get_sample_value("nodetaskd_hub_node_mark_oldest_seconds") == 3
    assert registry.get_sample_value("nodetaskd_hub_node_marks_pending") == 0


async def test_stuck_marks_are_logged_once_when_they_stick_and_once_when_they_flow(
    hub: tuple[Hub, CollectorRegistry], autojump_clock: trio.testing.MockClock
) -> None:
    """The hub warns when a mark passes markPendingLimit, not again while it stays stuck, and says when marks flow."""
    the_hub, _ = hub
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(the_hub.node_marks.watch)
            with the_hub.marks.pending():
                await anyio.sleep(200)
            await anyio.sleep(30)
            tg.cancel_scope.cancel()
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("node_marks_stuck", "warning"),
        ("node_marks_flowing", "info"),
    ]
    assert logs[0]["error"] == "Node marks stuck: 1 pending, the oldest for 70 s (markPendingLimit 60 s)"
