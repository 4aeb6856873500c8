"""What one device takes of diagnosis Tasks: request data, the store's quota, turns, and what it keeps after.

The agent runs against the fake hub of :mod:`tests.unit.roles.edge.test_agent`, with its real store on disk;
the turns are also shown with the real ``httpServer`` processor against a real server on loopback.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio
import msgspec
import structlog
import trio
from trio.testing import MockClock

from nodetask.messages import Ack, Cancel, Report, ReportAck
from roles.common.config import DiagnosisConfig
from roles.common.httpserver import HttpRoute, Request, Response, router, serve_http
from roles.edge import processors, task_limits
from roles.edge.processors import ProcessorEnv, ProcessorOutcome
from roles.edge.processors.http import MAX_BODY_BYTES
from roles.edge.store.records import TaskState
from schemas.processors import HTTPServer, Processor
from tests.unit.roles.edge.doubles import PROCESSOR, FakeActions, run_action, running_edge, summary, task_action

LOOPBACK: Final = "127.0.0.1"


# ------------------------------------------------------------------------------------------ request data


def test_request_data_is_measured_as_json_and_only_it_counts() -> None:
    """At the limit a Task is taken, one byte over it is not, and the reason names the setting; a large processor
    with small request data is not request data; a spec over the limit that does not decode is refused."""
    limit = 64 << 10
    overhead = len(msgspec.json.encode({"p": "", "task.uid": "uid-t"}))

    def spec(size: int) -> bytes:
        return bytes(task_action("t", parameters={"p": "x" * (size - overhead)}).spec)

    assert task_limits.request_refusal(spec(limit), limit) == ""
    refusal = task_limits.request_refusal(spec(limit + 1), limit)
    assert refusal == (
        f"the Task's request data is {limit + 1} bytes as JSON, more than the {limit} this node takes"
        " (diagnosis.maxRequestBytes in its config)"
    )
    big_processor = Processor(http_server=HTTPServer(path="/" + "p" * limit), timeout_seconds=5)
    assert task_limits.request_refusal(bytes(task_action("t", processor=big_processor).spec), limit) == ""
    assert task_limits.request_refusal(b"[" * (limit + 1), limit).startswith("the task spec is invalid: ")


async def test_a_task_over_the_request_limit_fails_on_arrival_naming_the_setting_and_none_of_it_is_stored(
    tmp_path: Path, clock: MockClock
) -> None:
    """600 KiB of request data (a hub sends up to 768 KiB): acknowledged, failed at once naming
    ``diagnosis.maxRequestBytes``, its processor never run, and the store grows by a few KiB, not 600;
    sent again, it is answered with the same failure and still not run."""
    big = task_action("big", parameters={"blob": "x" * (600 << 10)})
    async with running_edge(tmp_path) as edge:
        before = await edge.store.used_bytes()
        session = await edge.hub.accept()
        await session.send(big)
        assert await session.receive() == Ack(id="run-big")
        (report,) = await session.reports(1)
        assert summary([report]) == [(1, "uid-big", "Run", False)]
        assert report.reason.startswith("the Task's request data is ")
        assert "more than the 131072 this node takes (diagnosis.maxRequestBytes in its config)" in report.reason
        assert edge.actions.processed == []
        task = await edge.store.get_task("uid-big")
        assert task is not None
        assert (task.state, task.spec) == (TaskState.FINISHED, b"")
        assert await edge.store.used_bytes() - before < 64 << 10

        await session.send(big)
        assert await session.receive() == Ack(id="run-big")
        (again,) = await session.reports(1)
        assert (again.seq, again.succ, again.reason) == (2, False, report.reason)
        assert edge.actions.processed == []


# ----------------------------------------------------------------------------------------- store quota


async def test_new_tasks_fail_naming_the_store_quota_while_node_jobs_and_reports_go_on(
    tmp_path: Path, clock: MockClock
) -> None:
    """With the store at its quota a new Task fails naming ``storeQuotaBytes`` and stores nothing of its data;
    a node job still runs and every report arrives; once room is made, the next Task runs."""
    quota = 1 << 20
    async with running_edge(tmp_path, store_quota_bytes=quota) as edge:
        await edge.store.set_fact("ballast", "x" * quota)  # what 30 Diagnoses of 600 KiB once left behind
        session = await edge.hub.accept()
        await session.send(task_action("t"))
        assert await session.receive() == Ack(id="run-t")
        (refused,) = await session.reports(1)
        assert summary([refused]) == [(1, "uid-t", "Run", False)]
        assert refused.reason.startswith("the node's store holds ")
        assert f"at its quota of {quota} (storeQuotaBytes in its config)" in refused.reason
        assert edge.actions.processed == []

        await session.send(run_action("job"))
        assert await session.receive() == Ack(id="run-job")
        assert summary(await session.reports(2)) == [(2, "uid-job", "Check", True), (3, "uid-job", "Pull", True)]
        assert (await edge.agent.status())["connected"] == "true"

        await edge.store.delete_fact("ballast")
        await session.send(task_action("u"))
        assert await session.receive() == Ack(id="run-u")
        assert summary(await session.reports(1)) == [(4, "uid-u", "Run", True)]


# ---------------------------------------------------------------------------------- a finished task's data


async def test_a_finished_tasks_request_data_leaves_the_store_once_its_report_is_acknowledged(
    tmp_path: Path, clock: MockClock
) -> None:
    """A Task that ran keeps its request data until the hub acknowledges its report, then only what answers a
    re-delivery: sent again, the Task is not run again and its result is reported again."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        run = task_action("t", parameters={"blob": "x" * (100 << 10)})
        await session.send(run)
        assert await session.receive() == Ack(id="run-t")
        (report,) = await session.reports(1)
        task = await edge.store.get_task("uid-t")
        assert task is not None
        assert task.spec == bytes(run.spec)
        await session.send(ReportAck(job_uid=report.job_uid, seq=report.seq))
        await session.send(run)
        assert await session.receive() == Ack(id="run-t")  # sent after the acknowledgement was taken
        task = await edge.store.get_task("uid-t")
        assert task is not None
        assert (task.state, task.spec) == (TaskState.FINISHED, b"")
        (again,) = await session.reports(1)
        assert (again.seq, again.succ, again.extend) == (2, True, report.extend)
        assert len(edge.actions.processed) == 1


# ----------------------------------------------------------------------------------------------- turns


@dataclass(eq=False)
class HeldActions(FakeActions):
    """Processors that run until :attr:`release` is set for their Task's uid."""

    release: dict[str, anyio.Event] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def process(self, processor: Processor, request: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
        uid = request["task.uid"]
        self.started.append(uid)
        self.changed.set()
        self.changed = anyio.Event()
        await self.release.setdefault(uid, anyio.Event()).wait()
        return await super().process(processor, request, env)

    async def wait_started(self, count: int) -> None:
        while len(self.started) < count:
            await self.changed.wait()


async def test_a_task_that_gets_no_turn_within_its_timeout_fails_naming_the_setting(
    tmp_path: Path, clock: MockClock
) -> None:
    """With one turn taken by a Task that does not end, the next waits its operation's timeoutSeconds (5 s) and
    fails naming ``diagnosis.maxConcurrentTasks``, never having run; the first, cancelled, frees the turn."""
    actions = HeldActions()
    async with running_edge(tmp_path, max_concurrent_tasks=1, actions=actions) as edge:
        session = await edge.hub.accept()
        await session.send(task_action("a"))
        assert await session.receive() == Ack(id="run-a")
        await actions.wait_started(1)
        await session.send(task_action("b"))
        assert await session.receive() == Ack(id="run-b")
        waited_from = anyio.current_time()
        (missed,) = await session.reports(1)
        assert anyio.current_time() - waited_from >= PROCESSOR.timeout_seconds
        assert summary([missed]) == [(1, "uid-b", "Run", False)]
        assert missed.reason == (
            "no turn to run within 5 s (the operation's timeoutSeconds): 1 Tasks ran on this node all that time"
            " (diagnosis.maxConcurrentTasks in its config)"
        )
        assert actions.started == ["uid-a"]
        run_a = task_action("a")
        await session.send(Cancel(route=run_a.route, job_uid=run_a.job_uid))
        assert summary(await session.reports(1)) == [(2, "uid-a", "Run", False)]
        await session.send(task_action("c"))
        assert await session.receive() == Ack(id="run-c")
        await actions.wait_started(2)
        actions.release.setdefault("uid-c", anyio.Event()).set()
        assert summary(await session.reports(1)) == [(3, "uid-c", "Run", True)]


async def test_tasks_over_the_bound_wait_their_turn_and_each_runs_once_one_ends(
    tmp_path: Path, clock: MockClock
) -> None:
    """Two turns, three Tasks: the third starts only once one of the first two has ended, and all succeed."""
    actions = HeldActions()
    patient = msgspec.structs.replace(PROCESSOR, timeout_seconds=600)  # a slow disk costs virtual seconds
    async with running_edge(tmp_path, max_concurrent_tasks=2, actions=actions) as edge:
        session = await edge.hub.accept()
        for name in ("a", "b", "c"):
            await session.send(task_action(name, processor=patient))
            assert await session.receive() == Ack(id=f"run-{name}")
        await actions.wait_started(2)
        await anyio.sleep(1)
        assert actions.started == ["uid-a", "uid-b"]
        actions.release.setdefault("uid-b", anyio.Event()).set()
        assert summary(await session.reports(1)) == [(1, "uid-b", "Run", True)]
        await actions.wait_started(3)
        assert actions.started == ["uid-a", "uid-b", "uid-c"]
        for uid in ("uid-a", "uid-c"):
            actions.release.setdefault(uid, anyio.Event()).set()
        assert sorted(r.job_uid for r in await session.reports(2)) == ["uid-a", "uid-c"]


@dataclass(eq=False)
class Answers:
    """A real HTTP server's view of the processors' requests: how many it held at once, at most."""

    limit: int
    total: int
    in_flight: int = 0
    peak: int = 0
    arrived: int = 0
    changed: trio.Event = field(default_factory=trio.Event)

    async def answer(self, request: Request) -> Response:
        """Hold each request until ``limit`` are held together (or a second has passed, for the last ones) and a
        little longer, for any request over the limit to show up, then answer with a 2 MiB object of strings, the
        most an answer may be."""
        self.in_flight += 1
        self.arrived += 1
        self.peak = max(self.peak, self.in_flight)
        self._changed()
        try:
            with trio.move_on_after(1.0):
                while self.in_flight < self.limit and self.arrived < self.total:
                    await self.changed.wait()
            await trio.sleep(0.2)
            body = msgspec.json.encode({"blob": "x" * (MAX_BODY_BYTES - 11)})
            assert len(body) == MAX_BODY_BYTES
            return Response.json(200, body)
        finally:
            self.in_flight -= 1
            self._changed()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


async def test_forty_tasks_posting_to_a_real_server_have_at_most_their_turns_of_answers_in_flight(
    tmp_path: Path,
) -> None:
    """40 Tasks whose ``httpServer`` answers are 2 MiB each: the server never holds more than
    ``diagnosis.maxConcurrentTasks`` of their requests at once (so the agent never holds more of their
    answers), it does hold that many, and every Task succeeds with its results clipped."""
    turns = 4
    answers = Answers(limit=turns, total=40)
    async with trio.open_nursery() as nursery:
        serve = functools.partial(
            serve_http,
            router([HttpRoute("POST", "/diag", answers.answer)]),
            host=LOOPBACK,
            port=0,
            log=structlog.get_logger(),
        )
        port: int = await nursery.start(serve)
        processor = Processor(http_server=HTTPServer(address=LOOPBACK, port=port, path="/diag"), timeout_seconds=120)
        actions = RealProcessors(diagnosis=DiagnosisConfig(loopback_ports=(port,)))
        async with running_edge(tmp_path, max_concurrent_tasks=turns, actions=actions) as edge:
            session = await edge.hub.accept()
            for i in range(answers.total):
                await session.send(task_action(f"t{i}", processor=processor))
            frames = [await session.receive() for _ in range(2 * answers.total)]
            reports = [r for r in frames if isinstance(r, Report)]
        nursery.cancel_scope.cancel()
    assert answers.arrived == answers.total
    assert answers.peak == turns
    assert len(reports) == answers.total
    for report in reports:
        assert report.succ, report.reason
        assert len(msgspec.json.decode(report.extend, type=dict[str, str])["blob"]) < 65 << 10


@dataclass(eq=False)
class RealProcessors(FakeActions):
    """The agent's own processors (:func:`roles.edge.processors.run`)."""

    async def process(self, processor: Processor, request: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
        self.processed.append((processor, request))
        return await processors.run(processor, request, env)
