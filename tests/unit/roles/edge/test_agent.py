"""The edge agent against a fake hub over in-memory links, in virtual time, with its real store on disk.

The tests play the hub's part (:mod:`tests.unit.roles.edge.doubles`); they wait for frames, never for time.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest
import trio.testing
from trio.testing import MockClock

from flows.diagnosis import job as diagnosis_job
from flows.nodejobs import imageprepulljob
from nodetask.messages import (
    ATTEMPTS_CAPABILITY,
    PING_CAPABILITY,
    Ack,
    Cancel,
    Error,
    Report,
    ReportAck,
)
from nodetask.registry_credentials import TYPED_CREDENTIALS
from roles.edge.processors import ProcessorOutcome
from roles.edge.store.records import TaskState
from tests.unit.roles.edge.doubles import (
    AUTH,
    GUARD,
    IMAGE,
    INTERVAL,
    NODE,
    OLD_FORM,
    PROCESSOR,
    SPEC,
    run_action,
    running_edge,
    summary,
    task_action,
)


async def test_a_run_action_is_acknowledged_only_once_it_is_stored(tmp_path: Path, clock: MockClock) -> None:
    """While the store cannot take the task (its write lock held elsewhere), the hub gets no Ack; then it does."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        blocker = sqlite3.connect(edge.store.path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            await session.send(run_action("a"))
            await trio.testing.wait_all_tasks_blocked()
            assert session.nothing_received()
            # Through the blocking connection: the agent's store waits behind its own pending write.
            assert blocker.execute("SELECT count(*) FROM node_tasks").fetchone() == (0,)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert await session.receive() == Ack(id="run-a")
        assert await edge.store.get_task("uid-a") is not None


async def test_actions_run_in_flow_order_and_their_reports_go_out_in_seq_order(
    tmp_path: Path, clock: MockClock
) -> None:
    """A RunAction is acked, then Check and Pull run and their reports arrive as seq 1 and 2."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        await session.send(run_action("a"))
        assert await session.receive() == Ack(id="run-a")
        assert summary(await session.reports(2)) == [(1, "uid-a", "Check", True), (2, "uid-a", "Pull", True)]
        assert edge.actions.runs == [("uid-a", "Check"), ("uid-a", "Pull")]


async def test_unacknowledged_reports_are_sent_again_on_each_new_session_until_acknowledged(
    tmp_path: Path, clock: MockClock
) -> None:
    """Reports the hub did not acknowledge come again after a reconnect; acknowledged ones never do."""
    async with running_edge(tmp_path) as edge:
        first = await edge.hub.accept()
        await first.send(run_action("a"))
        assert await first.receive() == Ack(id="run-a")
        assert [r.seq for r in await first.reports(2)] == [1, 2]
        await first.link.close()

        second = await edge.hub.accept()
        resent = await second.reports(2)
        assert [r.seq for r in resent] == [1, 2]
        for report in resent:
            await second.send(ReportAck(job_uid=report.job_uid, seq=report.seq))
        await second.send(run_action("b"))
        assert await second.receive() == Ack(id="run-b")  # sent after the acks above were taken
        assert [r.seq for r in await second.reports(2)] == [3, 4]
        await second.link.close()

        third = await edge.hub.accept()
        assert summary(await third.reports(2)) == [(3, "uid-b", "Check", True), (4, "uid-b", "Pull", True)]
        assert edge.actions.runs == [("uid-a", "Check"), ("uid-a", "Pull"), ("uid-b", "Check"), ("uid-b", "Pull")]


async def test_a_duplicate_run_action_does_not_run_the_task_again_but_reports_its_latest_result(
    tmp_path: Path, clock: MockClock
) -> None:
    """The same job UID sent again is acked and answered with its newest result; no action runs twice."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        await session.send(run_action("a"))
        assert await session.receive() == Ack(id="run-a")
        for report in await session.reports(2):
            await session.send(ReportAck(job_uid=report.job_uid, seq=report.seq))
        await session.send(run_action("a"))
        assert await session.receive() == Ack(id="run-a")
        assert summary(await session.reports(1)) == [(3, "uid-a", "Pull", True)]
        assert edge.actions.runs == [("uid-a", "Check"), ("uid-a", "Pull")]


@pytest.mark.parametrize("code", ["job_gone", "report_rejected"])
async def test_a_report_the_hub_refuses_for_good_is_dropped(tmp_path: Path, clock: MockClock, code: str) -> None:
    """An Error with a final code naming a report's seq takes it out of the outbox, with the hub's reason."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        await session.send(run_action("a"))
        assert await session.receive() == Ack(id="run-a")
        await session.reports(2)
        await session.send(Error(code=code, message="no such job", ref="1"))
        await session.send(Error(code="internal", message="try later", ref="2"))  # not final: kept
        await session.send(run_action("b", action=imageprepulljob.PULL))
        assert await session.receive() == Ack(id="run-b")  # sent after the errors above were handled
        assert [(d.report.seq, d.reason) for d in await edge.store.dropped()] == [(1, f"{code}: no such job")]
        assert [r.seq for r in await edge.store.pending()][:1] == [2]


async def test_heartbeats_go_out_at_the_interval_the_hub_asked_for(tmp_path: Path, clock: MockClock) -> None:
    """The first heartbeat follows the Welcome at once, then one every interval, exactly."""
    async with running_edge(tmp_path) as edge:
        edge.hub.interval = 7.0
        session = await edge.hub.accept()
        start = session.welcomed_at
        assert await session.wait_heartbeats(4) == [start, start + 7.0, start + 14.0, start + 21.0]


async def test_an_agent_pings_instead_of_sending_heartbeats_to_a_hub_that_lists_pings(
    tmp_path: Path, clock: MockClock
) -> None:
    """Welcomed by a hub listing pings, the agent pings every interval, sends no Heartbeat, and stays connected."""
    async with running_edge(tmp_path, echo=False) as edge:
        edge.hub.interval = 5.0
        edge.hub.capabilities = (PING_CAPABILITY,)
        session = await edge.hub.accept()
        assert PING_CAPABILITY in edge.hub.hellos[0].capabilities
        await anyio.sleep(22.0)
        assert session.heartbeats == []
        assert session.ended_at is None
        assert session.link.heard_at() == session.welcomed_at + 20.0
        assert edge.agent.connects == 1


async def test_a_hub_that_answers_no_ping_for_three_intervals_is_left_and_the_agent_reconnects(
    tmp_path: Path, clock: MockClock
) -> None:
    """A ping with no pong for three heartbeat intervals ends the session; the agent connects again."""
    async with running_edge(tmp_path) as edge:
        edge.hub.interval = 5.0
        edge.hub.capabilities = (PING_CAPABILITY,)
        edge.hub.reads = False
        first = await edge.hub.accept()
        edge.hub.reads = True
        await edge.hub.accept()
        assert await edge.agent.wait_connected(INTERVAL)
        assert edge.agent.connects == 2
        assert edge.hub.attempts[1] >= first.welcomed_at + 15.0


async def test_a_silent_hub_ends_the_session_after_three_intervals_and_the_agent_reconnects_with_backoff(
    tmp_path: Path, clock: MockClock
) -> None:
    """With no frame from the hub for three heartbeat intervals the agent closes the link, then reconnects,
    each failed attempt waiting longer (within the jittered bounds of a doubling ceiling)."""
    async with running_edge(tmp_path, echo=False) as edge:
        edge.hub.interval = 5.0
        session = await edge.hub.accept()
        assert await edge.agent.wait_connected(INTERVAL)
        edge.hub.refuse = 2
        await edge.hub.accept()
        assert await edge.agent.wait_connected(INTERVAL)
        assert session.ended_at is not None
        assert session.ended_at >= session.welcomed_at + 15.0
        assert edge.agent.connects == 2
        end, *attempts = [session.ended_at, *edge.hub.attempts[1:]]
        gaps = [b - a for a, b in itertools.pairwise([end, *attempts])]
        ceilings = [0.5, 1.0, 2.0]
        assert len(gaps) == len(ceilings)
        assert all(c / 2 <= gap <= c for gap, c in zip(gaps, ceilings, strict=True)), gaps


async def test_a_hub_down_for_long_is_tried_again_at_most_reconnect_max_delay_apart(
    tmp_path: Path, clock: MockClock
) -> None:
    """Refused attempts double their waits only up to ``reconnectMaxDelay`` (3 s here), each drawn from its
    upper half: an edge is back within that long of its hub."""
    async with running_edge(tmp_path, echo=False, refuse=8, reconnect_cap=3.0) as edge:
        edge.hub.interval = 5.0
        await edge.hub.accept()
        assert await edge.agent.wait_connected(INTERVAL)
        gaps = [b - a for a, b in itertools.pairwise(edge.hub.attempts)]
        ceilings = [0.5, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0]
        assert len(gaps) == len(ceilings)
        assert all(c / 2 <= gap <= c for gap, c in zip(gaps, ceilings, strict=True)), gaps


async def test_the_backoff_starts_over_once_a_session_was_welcomed(tmp_path: Path, clock: MockClock) -> None:
    """After refused attempts grew the backoff, a welcomed session resets it: its loss is retried within 0.5 s."""
    async with running_edge(tmp_path, echo=False) as edge:
        edge.hub.interval = 5.0
        first = await edge.hub.accept()
        edge.hub.refuse = 3
        second = await edge.hub.accept()  # after gaps of up to 0.5, 1 and 2 s and a fourth of up to 4 s
        assert first.ended_at is not None
        assert await edge.agent.wait_connected(INTERVAL)
        await edge.hub.accept()
        assert second.ended_at is not None
        retry = edge.hub.attempts[-1] - second.ended_at
        assert 0.25 <= retry <= 0.5, retry


async def test_a_cancel_stops_a_running_task_and_records_it_as_failed(tmp_path: Path, clock: MockClock) -> None:
    """Cancel interrupts the running action; the task ends with a failed report saying it was cancelled."""
    async with running_edge(tmp_path, block_pull=True) as edge:
        session = await edge.hub.accept()
        run = run_action("a")
        await session.send(run)
        assert await session.receive() == Ack(id="run-a")
        assert summary(await session.reports(1)) == [(1, "uid-a", "Check", True)]
        await edge.actions.pull_started.wait()
        await session.send(Cancel(route=run.route, job_uid=run.job_uid))
        (report,) = await session.reports(1)
        assert (report.seq, report.action, report.succ) == (2, "Pull", False)
        assert report.reason == "cancelled: the job was deleted or interrupted in the cloud"
        assert edge.actions.pull_cancelled
        task = await edge.store.get_task("uid-a")
        assert task is not None
        assert task.state is TaskState.FINISHED


async def test_a_task_runs_its_processor_on_its_request_and_reports_the_results_in_extend(
    tmp_path: Path, clock: MockClock
) -> None:
    """A Task's RunAction is acked once stored; its Operation's processor gets the request data with ``task.uid``,
    and one report of Run carries the results as a JSON object of strings."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        await session.send(task_action("t"))
        assert await session.receive() == Ack(id="run-t")
        (report,) = await session.reports(1)
        assert (report.seq, report.job_uid, report.action, report.succ) == (1, "uid-t", "Run", True)
        assert msgspec.json.decode(report.extend) == {"open": "yes"}
        assert str(report.route) == f"diagnosis.kubediag.org/v1/task/t/nodes/{NODE}"
        assert edge.actions.processed == [(PROCESSOR, {"target": "10.0.0.1", "task.uid": "uid-t"})]


async def test_a_failed_processor_and_results_over_the_bound_are_reported_as_failures_with_the_reason(
    tmp_path: Path, clock: MockClock
) -> None:
    """The processor's reason is the report's; results too large for the wire fail the Task saying so."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        edge.actions.processor_outcome = ProcessorOutcome(False, reason="HTTP 500 from 127.0.0.1:9/check")
        await session.send(task_action("a"))
        assert await session.receive() == Ack(id="run-a")
        (failed,) = await session.reports(1)
        assert (failed.succ, failed.reason, failed.extend) == (False, "HTTP 500 from 127.0.0.1:9/check", "")
        edge.actions.processor_outcome = ProcessorOutcome(True, {"k": "x" * diagnosis_job.MAX_RESULTS_BYTES})
        await session.send(task_action("b"))
        assert await session.receive() == Ack(id="run-b")
        (big,) = await session.reports(1)
        assert not big.succ
        assert big.reason.startswith("Operation check: the results are ")
        assert f"more than the {diagnosis_job.MAX_RESULTS_BYTES} a task may report" in big.reason


async def test_a_task_runs_while_an_upgrade_holds_the_nodes_exclusive_slot_and_never_takes_it(
    tmp_path: Path, clock: MockClock
) -> None:
    """Diagnosing only looks at the device: a Task runs beside the agent-changing task holding the slot."""
    async with running_edge(tmp_path) as edge:
        await edge.store.add_task(
            job_uid="uid-up", route="r", job_type="nodeupgradejob", spec=b"{}", run_action_id="x", action="Upgrade"
        )
        assert await edge.store.try_begin_exclusive("uid-up", "nodeupgradejob") is None
        session = await edge.hub.accept()
        await session.send(task_action("t"))
        assert await session.receive() == Ack(id="run-t")
        (report,) = await session.reports(1)
        assert report.succ
        hold = await edge.store.exclusive_hold()
        assert hold is not None
        assert hold.job_uid == "uid-up"


async def test_the_agent_status_names_its_version_store_outbox_depth_and_hub(tmp_path: Path, clock: MockClock) -> None:
    """What the ``agent.status`` collector reports: version, node, store health, unacknowledged reports, the hub."""
    async with running_edge(tmp_path) as edge:
        assert (await edge.agent.status())["connected"] == "false"
        session = await edge.hub.accept()
        await session.send(task_action("t"))
        assert await session.receive() == Ack(id="run-t")
        await session.reports(1)
        assert await edge.agent.status() == {
            "version": "v0.1.0",
            "node": NODE,
            "store": "ok",
            "outboxDepth": "1",
            "hub": "fake",
            "connected": "true",
        }


# ------------------------------------------------------------------- registry credentials from the hub


async def test_an_agent_says_in_its_hello_that_it_reads_typed_credentials(tmp_path: Path, clock: MockClock) -> None:
    """The Hello carries the capability the hub decides by."""
    async with running_edge(tmp_path) as edge:
        await edge.hub.accept()
        assert TYPED_CREDENTIALS in edge.hub.hellos[0].capabilities


async def test_an_agent_gives_its_pulls_the_typed_credentials_of_a_new_hub(tmp_path: Path, clock: MockClock) -> None:
    """Credentials sent typed are what the job's pull asks the agent for, unchanged."""
    async with running_edge(tmp_path, block_pull=True) as edge:
        session = await edge.hub.accept()
        await session.send(msgspec.structs.replace(run_action("a"), registry_credentials={IMAGE: AUTH}))
        assert await session.receive() == Ack(id="run-a")
        await edge.actions.pull_started.wait()
        assert edge.agent.credentials("uid-a") == ({IMAGE: AUTH}, "")


async def test_an_agent_forgets_a_jobs_credentials_once_its_task_has_ended(tmp_path: Path, clock: MockClock) -> None:
    """After the last report of a task, and after a RunAction re-sent for it, the agent holds no credentials for it."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        run = msgspec.structs.replace(run_action("a"), registry_credentials={IMAGE: AUTH})
        await session.send(run)
        assert await session.receive() == Ack(id="run-a")
        assert summary(await session.reports(2)) == [(1, "uid-a", "Check", True), (2, "uid-a", "Pull", True)]
        await trio.testing.wait_all_tasks_blocked()  # the task's walk has returned
        assert edge.agent.credentials("uid-a") == ({}, "")
        await session.send(run)  # a hub re-sending after a reconnect
        assert await session.receive() == Ack(id="run-a")
        assert edge.agent.credentials("uid-a") == ({}, "")


async def test_an_agent_forgets_the_credentials_of_a_cancelled_task(tmp_path: Path, clock: MockClock) -> None:
    """A task the hub cancels mid-pull leaves no credentials behind."""
    async with running_edge(tmp_path, block_pull=True) as edge:
        session = await edge.hub.accept()
        run = msgspec.structs.replace(run_action("a"), registry_credentials={IMAGE: AUTH})
        await session.send(run)
        assert await session.receive() == Ack(id="run-a")
        await session.reports(1)
        await edge.actions.pull_started.wait()
        assert edge.agent.credentials("uid-a") == ({IMAGE: AUTH}, "")
        await session.send(Cancel(route=run.route, job_uid="uid-a"))
        (report,) = await session.reports(1)
        assert (report.action, report.succ) == ("Pull", False)
        await trio.testing.wait_all_tasks_blocked()  # the task's walk has returned
        assert edge.agent.credentials("uid-a") == ({}, "")


async def test_an_agent_reads_the_string_credentials_of_an_old_hub(tmp_path: Path, clock: MockClock) -> None:
    """A RunAction frame as hubs before the typed field write it gives the pulls the same typed credentials."""
    route = run_action("old").route
    frame = {
        "op": "run_action",
        "id": "run-old",
        "route": str(route),
        "jobUid": "uid-old",
        "action": "Check",
        "spec": msgspec.json.decode(SPEC),
        "credentials": {IMAGE: OLD_FORM},
        "credentialsError": "",
    }
    async with running_edge(tmp_path, block_pull=True) as edge:
        session = await edge.hub.accept()
        await session.link.send(json.dumps(frame).encode())
        assert await session.receive() == Ack(id="run-old")
        await edge.actions.pull_started.wait()
        assert edge.agent.credentials("uid-old") == ({IMAGE: AUTH}, "")


async def test_an_agent_forgets_finished_tasks_after_their_retention(tmp_path: Path, clock: MockClock) -> None:
    """A finished task whose reports the hub acknowledged is gone from the store once its retention has passed."""
    async with running_edge(tmp_path, task_retention=GUARD / 4) as edge:
        session = await edge.hub.accept()
        await session.send(run_action("a"))
        assert await session.receive() == Ack(id="run-a")
        for report in await session.reports(2):
            await session.send(ReportAck(job_uid=report.job_uid, seq=report.seq))
        assert await edge.store.get_task("uid-a") is not None
        # Pruning runs every quarter of the retention from the agent's start: wake between the tick that
        # forgets the task (the fifth) and the next, so that its store call has begun before this one.
        await anyio.sleep(GUARD / 4 * 1.4)
        assert await edge.store.get_task("uid-a") is None


def attempts(reports: list[Report]) -> list[tuple[str, bool, int]]:
    return [(r.action, r.succ, r.attempt) for r in reports]


async def test_the_agent_announces_that_it_keys_tasks_by_attempt(tmp_path: Path, clock: MockClock) -> None:
    """Its Hello carries the 'attempts' capability, which hubs require before sending it a retry."""
    async with running_edge(tmp_path) as edge:
        await edge.hub.accept()
        assert ATTEMPTS_CAPABILITY in edge.hub.hellos[0].capabilities


async def test_a_retry_runs_the_task_again_and_its_reports_name_the_attempt(tmp_path: Path, clock: MockClock) -> None:
    """Attempt 2 of a finished task runs every action again; re-sent, attempt 2 or a late attempt 1 runs nothing."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        await session.send(run_action("a"))
        assert await session.receive() == Ack(id="run-a")
        assert attempts(await session.reports(2)) == [("Check", True, 1), ("Pull", True, 1)]

        await session.send(run_action("a", attempt=2))
        assert await session.receive() == Ack(id="run-a-2")
        assert attempts(await session.reports(2)) == [("Check", True, 2), ("Pull", True, 2)]
        assert edge.actions.runs == [("uid-a", "Check"), ("uid-a", "Pull")] * 2

        for late in (run_action("a", attempt=2), run_action("a", attempt=1)):
            await session.send(late)
            assert await session.receive() == Ack(id=late.id)
            assert attempts(await session.reports(1)) == [("Pull", True, 2)]  # the newest result, resent
        assert len(edge.actions.runs) == 4
        task = await edge.store.get_task("uid-a")
        assert task is not None
        assert (task.attempt, task.state) == (2, TaskState.FINISHED)


async def test_a_retry_arriving_while_the_first_attempt_still_runs_ends_it_first(
    tmp_path: Path, clock: MockClock
) -> None:
    """A Pull of attempt 1 still running is cancelled and reported failed as attempt 1; then attempt 2 runs."""
    async with running_edge(tmp_path, block_pull=True) as edge:
        session = await edge.hub.accept()
        await session.send(run_action("a"))
        assert await session.receive() == Ack(id="run-a")
        assert attempts(await session.reports(1)) == [("Check", True, 1)]
        await edge.actions.pull_started.wait()
        edge.actions.pull_started = anyio.Event()

        await session.send(run_action("a", attempt=2))
        frames = [await session.receive() for _ in range(3)]  # the Ack goes out beside the outbox's reports
        assert Ack(id="run-a-2") in frames
        superseded, check = [f for f in frames if isinstance(f, Report)]
        assert attempts([superseded, check]) == [("Pull", False, 1), ("Check", True, 2)]
        assert superseded.reason == "cancelled: attempt 2 of the job replaced attempt 1"
        await edge.actions.pull_started.wait()

        # A Cancel meant for attempt 1 (from a hub that stopped its run late) leaves attempt 2 running.
        await session.send(Cancel(route=superseded.route, job_uid="uid-a", attempt=1))
        await session.send(run_action("b"))
        assert await session.receive() == Ack(id="run-b")
        assert edge.agent._tasks.running("uid-a")
        await session.send(Cancel(route=superseded.route, job_uid="uid-a", attempt=2))
        reports = [r for r in await session.reports(2) if r.job_uid == "uid-a"]  # and b's Check
        assert attempts(reports) == [("Pull", False, 2)]
