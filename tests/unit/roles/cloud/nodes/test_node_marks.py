"""Node marks: a patch waits its turn as long as its caller does, a refused one is retried, and a stuck mark makes the
hub unready."""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Iterator
from typing import Any, TypeVar, cast

import anyio
import anyio.lowlevel
import msgspec
import pytest
import structlog
import structlog.testing
import trio.testing
from prometheus_client import CollectorRegistry

from nodetask.clock import Clock
from nodetask.messages import RunAction
from nodetask.phases import NodeTaskPhase
from roles.cloud.hub import Hub, HubSettings
from roles.cloud.metrics import HubMetrics
from roles.cloud.nodes.marks import FAILED, RETRY_CAP, RETRY_INITIAL, WRITTEN, NodeMarks, PendingMarks
from roles.common.health import Request, health_routes, router
from roles.common.jobtypes import job_types
from roles.kube import Kube
from roles.kube.aio import AioApi
from roles.kube.client import REQUESTS_IN_FLIGHT
from roles.kube.resources import NODES
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION
from tests.unit.roles.cloud.doubles import PREPULLS, edge_nodes, prepull_job, running_hub
from tests.unit.roles.cloud.nodes.doubles import CountingApi, FlakyNodes, SlowApi

T = TypeVar("T", bound=msgspec.Struct)


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


@contextlib.contextmanager
def _never(_: str) -> Iterator[anyio.Event]:
    yield anyio.Event()


def _marks(api: Any, settled: list[str]) -> NodeMarks:
    return NodeMarks(
        api,
        PendingMarks(anyio.current_time),
        hub_id="h",
        close_grace=2.0,
        pending_limit=60.0,
        seen=lambda _: None,
        awaiting=_never,
        settled=settled.append,
        log=structlog.get_logger(),
    )


async def test_a_refused_mark_is_retried_with_backoff_until_it_lands(autojump_clock: trio.testing.MockClock) -> None:
    """A refused mark is tried again, the pauses growing up to the cap, and counts as written once it lands; the
    session goes on (``answered``) at the first refusal, which is logged once, as is the landing."""
    api = FlakyNodes(refusals=8)
    settled: list[str] = []
    answered: list[float] = []
    marks = _marks(api, settled)
    with structlog.testing.capture_logs() as logs:
        await marks.mark("n1", "v1", structlog.get_logger(), answered=lambda: answered.append(anyio.current_time()))
    assert len(api.patched) == 9
    assert settled == [WRITTEN]
    assert answered == [api.patched[0]]
    pauses = [later - earlier for earlier, later in itertools.pairwise(api.patched)]
    assert all(RETRY_INITIAL / 2 <= pause <= RETRY_CAP for pause in pauses)
    assert max(pauses) > RETRY_CAP / 4  # the pauses grew towards the cap
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("node_not_marked", "warning"),
        *[("node_mark_retry_failed", "debug")] * 7,
        ("node_marked", "info"),
    ]
    assert len(marks.pending) == 0


async def test_a_mark_still_refused_when_its_session_ends_counts_as_failed_and_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The retries of a mark stop with its session, which counts it failed and sends nothing more."""
    api = FlakyNodes(refusals=math.inf)
    settled: list[str] = []
    with anyio.move_on_after(600):
        await _marks(api, settled).mark("n1", "v1", structlog.get_logger())
    tried = len(api.patched)
    await anyio.sleep(600)
    assert len(api.patched) == tried > 5
    assert settled == [FAILED]


async def test_a_mark_answered_at_once_is_counted_once_and_not_logged(autojump_clock: trio.testing.MockClock) -> None:
    """A mark that lands at the first try is written, answered once, and logs nothing."""
    api = FlakyNodes(refusals=0)
    settled: list[str] = []
    answered: list[str] = []
    with structlog.testing.capture_logs() as logs:
        await _marks(api, settled).mark("n1", "v1", structlog.get_logger(), answered=lambda: answered.append("n1"))
    assert (settled, answered, logs) == ([WRITTEN], ["n1"], [])


@pytest.mark.parametrize("cache_streams", [True, False], ids=["shared-node-watch", "own-node-watch"])
async def test_a_mark_whose_node_does_not_exist_lands_when_the_node_appears(
    autojump_clock: trio.testing.MockClock, cache_streams: bool
) -> None:
    """An edge connected before its Node exists is offered jobs at once, and its Node is marked once the Node watch
    shows it, without polling for it meanwhile."""
    api = CountingApi()
    api.put(PREPULLS, prepull_job("job", "uid-job", [("late", NodeTaskPhase.PENDING)]))
    async with running_hub(api, cache_streams=cache_streams, heartbeat_interval=3600.0) as (_, door):
        edge = door.connect("late")
        await edge.hello()
        await edge.next_of(RunAction)
        await anyio.sleep(600)
        assert api.patch_tries == 2  # the first answer, and one more once the watch could tell of a creation
        edge_nodes(api, "late")
        await anyio.sleep(1)
        marked = api.peek(NODES, "late").metadata.annotations
        assert marked == {HUB_ANNOTATION: "hub-a", AGENT_VERSION_ANNOTATION: "v1"}
        assert api.patch_tries == 3
        await edge.close()
