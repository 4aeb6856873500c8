"""A whole hub over memory links and an in-memory API server: dispatch, reports, heartbeats, replacement."""

from __future__ import annotations

import anyio
import msgspec
import pytest
import structlog
import trio.testing
from prometheus_client import CollectorRegistry

from flows.nodejobs.imageprepulljob import CHECK, PULL, encode_extend
from nodetask.clock import Clock
from nodetask.link import LinkClosed
from nodetask.messages import PING_CAPABILITY, Cancel, Error, Heartbeat, Report, ReportAck, RunAction
from nodetask.phases import ConditionStatus, NodeTaskPhase
from nodetask.route import Route
from roles.cloud.jobs.watch import Jobs
from roles.cloud.metrics import HubMetrics
from roles.cloud.sessions import GOING_AWAY, HEARTBEAT_MISSED, NOT_READING, OUTBOUND_QUEUE, REPLACED, SessionTable
from roles.cloud.settings import HubSettings
from roles.common.jobtypes import job_types
from roles.common.registry_auth import RegistryAuth
from roles.kube.errors import from_response
from roles.kube.resources import NODES
from schemas.core import HUB_ANNOTATION
from schemas.kinds import IMAGE_PRE_PULL_JOB
from schemas.v1alpha2 import API_VERSION, ImageStatus
from tests.unit.roles.cloud.doubles import PREPULLS, FakeEdge, MemoryApi, edge_nodes, prepull_job, running_hub

PENDING = NodeTaskPhase.PENDING
IN_PROGRESS = NodeTaskPhase.IN_PROGRESS
PULLED = encode_extend((ImageStatus(image="registry.example/app:1", status=ConditionStatus.TRUE),))


def _report(job: str, uid: str, node: str, seq: int, action: str = CHECK, *, extend: str = "") -> Report:
    route = Route(API_VERSION, "imageprepulljob", job, node)
    return Report(route=route, job_uid=uid, seq=seq, action=action, succ=True, extend=extend)


async def _complete(edge: FakeEdge, run: RunAction, first_seq: int) -> None:
    """The edge reports Check and Pull done, each acknowledged."""
    for seq, action, extend in ((first_seq, CHECK, ""), (first_seq + 1, PULL, PULLED)):
        await edge.send(_report(run.route.job, run.job_uid, edge.node, seq, action, extend=extend))
        assert await edge.next_of(ReportAck) == ReportAck(job_uid=run.job_uid, seq=seq)


async def _send_heartbeats(edge: FakeEdge, count: int) -> None:
    for i in range(count):
        await edge.send(Heartbeat(sent_at=float(i)))


def _entry(api: MemoryApi, job: str, node: str) -> object:
    return next(e for e in api.peek(PREPULLS, job).status.node_status if e.node_name == node)


def _hub_of(api: MemoryApi, node: str) -> str | None:
    return api.peek(NODES, node).metadata.annotations.get(HUB_ANNOTATION)


def _one_node_job(name: str) -> MemoryApi:
    """An API server holding node n0 and a pre-pull job ``name`` (UID ``uid-<name>``) pending on it."""
    api = MemoryApi()
    edge_nodes(api, "n0")
    api.put(PREPULLS, prepull_job(name, f"uid-{name}", [("n0", PENDING)]))
    return api


async def test_dispatch_takes_the_adopted_node_first_then_pending_ones_in_job_order_one_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With concurrency 1 the InProgress node gets its RunAction first, then each Pending one in order as one ends."""
    api = MemoryApi()
    edge_nodes(api, "n0", "n1", "n2")
    async with running_hub(api, heartbeat_interval=60.0) as (_, door):
        edges = {node: door.connect(node) for node in ("n1", "n2", "n0")}  # connected in another order
        for edge in edges.values():
            await edge.hello()
        job = prepull_job("order", "uid-order", [("n0", PENDING), ("n1", PENDING), ("n2", IN_PROGRESS)], concurrency=1)
        api.put(PREPULLS, job)
        for node in ("n2", "n0", "n1"):
            run = await edges[node].next_of(RunAction)
            assert (run.route.node, run.action) == (node, CHECK)
            for other in edges.values():
                if other is not edges[node]:
                    assert await other.frames_within(5) == []  # nobody else is dispatched meanwhile
            await _complete(edges[node], run, first_seq=1)
        await trio.testing.wait_all_tasks_blocked()
    entries = api.peek(PREPULLS, "order").status.node_status
    assert [(e.node_name, e.phase) for e in entries] == [(n, NodeTaskPhase.SUCCESSFUL) for n in ("n0", "n1", "n2")]


async def test_a_claim_held_back_by_concurrency_reads_the_job_again_only_once_a_slot_frees(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While another hub's node holds the only slot, changes that free none (its progress, a label) cost no read
    of the job; the node's end does, and the waiting node is dispatched."""
    api = MemoryApi()
    edge_nodes(api, "busy", "waiting")
    api.put(PREPULLS, prepull_job("full", "uid-full", [("busy", IN_PROGRESS), ("waiting", PENDING)], concurrency=1))
    async with running_hub(api, coalesce_window=0.2, heartbeat_interval=3600.0) as (hub, door):
        edge = door.connect("waiting")  # "busy" is another hub's
        await edge.hello()
        await anyio.sleep(5)
        (runner,) = hub.runners()
        assert runner.dispatched == []
        reads = api.reads["imageprepulljobs"]
        for i in range(20):
            job = api.peek(PREPULLS, "full")
            busy, waiting = job.status.node_status
            if i % 2:
                busy = msgspec.structs.replace(busy, reason=f"pulling, step {i}")
                job = msgspec.structs.replace(
                    job, status=msgspec.structs.replace(job.status, node_status=(busy, waiting))
                )
            else:
                labels = {"step": str(i)}
                job = msgspec.structs.replace(job, metadata=msgspec.structs.replace(job.metadata, labels=labels))
            api.put(PREPULLS, job)
            await anyio.sleep(1)
        assert api.reads["imageprepulljobs"] == reads
        assert runner.dispatched == []
        job = api.peek(PREPULLS, "full")
        busy, waiting = job.status.node_status
        done = msgspec.structs.replace(busy, phase=NodeTaskPhase.SUCCESSFUL)
        api.put(
            PREPULLS,
            msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, node_status=(done, waiting))),
        )
        run = await edge.next_of(RunAction)
        assert (run.route.node, [node for node, _ in runner.dispatched]) == ("waiting", ["waiting"])


async def test_an_edge_that_reconnects_before_acking_gets_its_run_action_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A RunAction whose session ended before the edge acknowledged it is sent again on the edge's next session."""
    api = _one_node_job("resend")
    async with running_hub(api) as (hub, door):
        first = door.connect("n0")
        await first.hello()
        sent = await first.next_of(RunAction)
        await first.close()
        second = door.connect("n0")
        await second.hello()
        again = await second.next_of(RunAction)
        assert (again.route, again.job_uid, again.action) == (sent.route, sent.job_uid, sent.action)
        assert (sent.id, again.id) == ("uid-resend/n0/1", "uid-resend/n0/2")
        assert [len(r.dispatched) for r in hub.runners()] == [1]  # claimed once, sent twice


async def test_a_report_is_acknowledged_only_after_its_status_write_has_landed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While the job's status write is held the edge hears nothing; the ReportAck follows the write."""
    api = _one_node_job("held")
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello()
        await edge.next_of(RunAction)
        api.hold_status = anyio.Event()
        await edge.send(_report("held", "uid-held", "n0", seq=1))
        assert await edge.frames_within(20) == []
        assert _entry(api, "held", "n0").action_flow == ()  # type: ignore[attr-defined]
        api.hold_status.set()
        assert await edge.next_of(ReportAck) == ReportAck(job_uid="uid-held", seq=1)
        assert [a.action for a in _entry(api, "held", "n0").action_flow] == [CHECK]  # type: ignore[attr-defined]


async def test_a_duplicate_report_is_applied_once_and_acknowledged_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The same report sent twice (an ack lost on the way) writes the status once and is acknowledged both times."""
    api = _one_node_job("dup")
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello()
        await edge.next_of(RunAction)
        report = _report("dup", "uid-dup", "n0", seq=1)
        await edge.send(report)
        assert await edge.next_of(ReportAck) == ReportAck(job_uid="uid-dup", seq=1)
        writes = api.status_writes
        await edge.send(report)
        assert await edge.next_of(ReportAck) == ReportAck(job_uid="uid-dup", seq=1)
        assert api.status_writes == writes
        assert [a.action for a in _entry(api, "dup", "n0").action_flow] == [CHECK]  # type: ignore[attr-defined]


async def test_a_report_for_another_node_is_refused_and_written_nowhere(autojump_clock: trio.testing.MockClock) -> None:
    """An edge reporting for a node not its own gets foreign_node with the report's seq, and no status changes."""
    api = MemoryApi()
    edge_nodes(api, "n0", "n1")
    api.put(PREPULLS, prepull_job("foreign", "uid-foreign", [("n0", PENDING), ("n1", PENDING)]))
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello()
        await edge.next_of(RunAction)
        writes = api.status_writes
        await edge.send(_report("foreign", "uid-foreign", "n1", seq=7))
        refused = await edge.next_of(Error)
        assert (refused.code, refused.ref) == ("foreign_node", "7")
        assert await edge.frames_within(5) == []
        assert api.status_writes == writes
        assert _entry(api, "foreign", "n1").phase is PENDING  # type: ignore[attr-defined]


async def test_heartbeats_are_echoed_and_a_silent_edge_is_closed_at_the_missed_heartbeat_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A heartbeat comes back with its sent_at; silent for three 10 s intervals, the session is closed with 4008."""
    api = MemoryApi()
    edge_nodes(api, "n0")
    async with running_hub(api, heartbeat_interval=10.0, missed_heartbeats=3) as (hub, door):
        edge = door.connect("n0")
        assert (await edge.hello()).heartbeat_interval == 10.0
        await edge.send(Heartbeat(sent_at=12.5))
        assert await edge.receive() == Heartbeat(sent_at=12.5)
        silent_since = anyio.current_time()
        await edge.closed()
        assert anyio.current_time() - silent_since == pytest.approx(30.0)
        assert edge.hub_end.closed_with == (HEARTBEAT_MISSED, "no heartbeat")
        await trio.testing.wait_all_tasks_blocked()
        assert "n0" not in hub.sessions
        assert _hub_of(api, "n0") is None


async def test_an_edge_that_pings_stays_connected_without_heartbeats_until_its_pings_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The Welcome lists pings; pings alone keep a session for minutes, and three silent intervals still close it."""
    api = MemoryApi()
    edge_nodes(api, "n0")
    async with running_hub(api, heartbeat_interval=10.0, missed_heartbeats=3) as (hub, door):
        edge = door.connect("n0")
        assert PING_CAPABILITY in (await edge.hello(capabilities=(PING_CAPABILITY,))).capabilities
        async with anyio.create_task_group() as reading:
            reading.start_soon(edge.closed)
            for _ in range(12):
                await edge.link.ping()
                await anyio.sleep(10.0)
            assert "n0" in hub.sessions
            silent_since = anyio.current_time() - 10.0
        assert anyio.current_time() - silent_since == pytest.approx(30.0)
        assert edge.hub_end.closed_with == (HEARTBEAT_MISSED, "no heartbeat")


async def test_a_newer_session_for_the_same_node_replaces_the_older_one(autojump_clock: trio.testing.MockClock) -> None:
    """The older session is closed with 4009, the newer one is served, and the Node stays marked by the hub."""
    api = MemoryApi()
    edge_nodes(api, "n0")
    async with running_hub(api) as (hub, door):
        older = door.connect("n0")
        await older.hello()
        await trio.testing.wait_all_tasks_blocked()
        assert _hub_of(api, "n0") == "hub-a"
        newer = door.connect("n0")
        await newer.hello()
        await older.closed()
        assert older.hub_end.closed_with == (REPLACED, "replaced by a newer session")
        await trio.testing.wait_all_tasks_blocked()
        session = hub.sessions.get("n0")
        assert session is not None
        assert session.link is newer.hub_end
        assert _hub_of(api, "n0") == "hub-a"
        await newer.send(Heartbeat(sent_at=1.0))
        assert await newer.receive() == Heartbeat(sent_at=1.0)


async def test_a_report_for_a_job_deleted_mid_run_is_answered_job_gone(autojump_clock: trio.testing.MockClock) -> None:
    """Deleting a running job sends the edge a Cancel, and a report that arrives after it gets job_gone."""
    api = _one_node_job("doomed")
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello()
        await edge.next_of(RunAction)
        api.delete(PREPULLS, "doomed")
        cancel = await edge.next_of(Cancel)
        assert (cancel.route.job, cancel.job_uid) == ("doomed", "uid-doomed")
        await edge.send(_report("doomed", "uid-doomed", "n0", seq=3))
        gone = await edge.next_of(Error)
        assert (gone.code, gone.ref) == ("job_gone", "3")


async def test_nodes_adopted_from_a_dead_hub_run_while_this_hubs_pending_nodes_wait_for_a_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Another hub claimed both slots and died; its nodes reconnect here after this hub's Pending ones began
    waiting for a slot, and still get their RunActions (the waiting claims hold no token of the pool)."""
    api = MemoryApi()
    edge_nodes(api, "n0", "n1", "n2", "n3")
    entries = [("n0", IN_PROGRESS), ("n1", IN_PROGRESS), ("n2", PENDING), ("n3", PENDING)]
    api.put(PREPULLS, prepull_job("adopt", "uid-adopt", entries, concurrency=2))
    async with running_hub(api) as (_, door):
        waiting = {node: door.connect(node) for node in ("n2", "n3")}
        for edge in waiting.values():
            await edge.hello()
        await anyio.sleep(5)  # both claims came back full and wait
        adopted = {node: door.connect(node) for node in ("n0", "n1")}
        with anyio.fail_after(60):
            for node, edge in adopted.items():
                await edge.hello()
                run = await edge.next_of(RunAction)
                assert (run.route.job, run.route.node) == ("adopt", node)
        for edge in waiting.values():
            assert not [f for f in await edge.frames_within(1) if isinstance(f, RunAction)]


async def test_a_report_meeting_an_unserved_resource_is_retried_not_answered_job_gone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A plain "404 page not found" (an API server not yet serving the CRD) delays the write; the report is acked."""
    api = _one_node_job("warming")
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello()
        run = await edge.next_of(RunAction)
        not_served = from_response(404, b"404 page not found\n", what="PUT imageprepulljobs/warming/status")
        api.status_errors = [not_served, not_served]
        await edge.send(_report("warming", run.job_uid, "n0", seq=1))
        assert await edge.next_of(ReportAck) == ReportAck(job_uid=run.job_uid, seq=1)
        assert not api.status_errors
        assert [a.action for a in _entry(api, "warming", "n0").action_flow] == [CHECK]  # type: ignore[attr-defined]


async def test_an_edge_that_stops_reading_is_closed_once_its_queue_stays_full_for_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeats from an edge that reads nothing fill its outbound queue; 30 s later the hub closes it with 4010."""
    api = MemoryApi()
    edge_nodes(api, "n0")
    async with running_hub(api, heartbeat_interval=10.0, missed_heartbeats=3) as (hub, door):
        edge = door.connect("n0")
        await edge.hello()
        session = hub.sessions.get("n0")
        assert session is not None
        with anyio.fail_after(600):  # virtual seconds: a hub that never gives up would hang the test
            with pytest.raises(LinkClosed):
                await _send_heartbeats(edge, OUTBOUND_QUEUE * 10)  # far more echoes than the link and queue hold
            await session.link_closed.wait()
        assert edge.hub_end.closed_with is not None
        assert edge.hub_end.closed_with[0] == NOT_READING
        assert "n0" not in hub.sessions


async def test_a_stopping_hub_closes_every_session_going_away_and_unmarks_its_nodes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every session gets 1001 when the hub stops, and the Nodes it held lose their mark."""
    api = MemoryApi()
    edge_nodes(api, "n0", "n1")
    async with running_hub(api) as (_, door):
        edges = [door.connect(node) for node in ("n0", "n1")]
        for edge in edges:
            await edge.hello()
        await trio.testing.wait_all_tasks_blocked()
        assert [_hub_of(api, edge.node) for edge in edges] == ["hub-a", "hub-a"]
    assert [edge.hub_end.closed_with for edge in edges] == [(GOING_AWAY, "hub shutting down")] * 2
    assert [_hub_of(api, edge.node) for edge in edges] == [None, None]


async def test_the_job_cache_is_synced_only_once_its_first_list_is_taken_in(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A report met as soon as the hub is ready must find its job: every listed job is cached, its runner
    started, by the time ``synced`` is set, not merely delivered to the cache's queue."""
    api = MemoryApi()
    names = [f"job{i}" for i in range(20)]
    for name in names:
        api.put(PREPULLS, prepull_job(name, f"uid-{name}", [("n0", PENDING)]))
    types = job_types()

    async def no_credentials(job: object) -> tuple[dict[str, RegistryAuth], str]:
        return {}, ""

    jobs = Jobs(
        api,
        types=types,
        sessions=SessionTable(),
        credentials=no_credentials,
        clock=Clock.start(),
        settings=HubSettings(hub_id="hub-a"),
        metrics=HubMetrics(CollectorRegistry(), sessions=lambda: 0, kube=lambda: (0, 0)),
        log=structlog.get_logger(),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(jobs.run)
        assert jobs.synced.is_set()
        assert [name for name in names if jobs.get(types[IMAGE_PRE_PULL_JOB.resource_type], name) is None] == []
        assert len(jobs.runners()) == len(names)
        tg.cancel_scope.cancel()
