"""What the edge store keeps of a task's spec: all of it while the task may still run or report, none after."""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import timedelta
from pathlib import Path

from roles.edge.store.records import NodeTask, TaskState
from roles.edge.store.store import EdgeStore, open_store
from tests.unit.roles.edge.store.task_builders import ROUTE, progress, ticking_clock

SPEC = b'{"version":"v1.2.3","padding":"' + b"x" * (600 << 10) + b'"}'
"""A spec of 600 KiB, as a Task's request data can be when a hub sends it."""


async def stored(store: EdgeStore, uid: str) -> NodeTask:
    task = await store.get_task(uid)
    assert task is not None
    return task


async def add(store: EdgeStore, uid: str, *, refusal: str = "") -> tuple[NodeTask, bool]:
    if refusal:
        return await store.add_task(
            job_uid=uid,
            route=ROUTE,
            job_type="nodeupgradejob",
            spec=SPEC,
            run_action_id=f"run-{uid}",
            action="Check",
            refusal=refusal,
            finish_time="2026-01-01T00:00:05Z",
        )
    # As agents always stored tasks: these tests run on the store from before refusals too.
    return await store.add_task(
        job_uid=uid, route=ROUTE, job_type="nodeupgradejob", spec=SPEC, run_action_id=f"run-{uid}", action="Check"
    )


async def test_a_finished_tasks_spec_leaves_with_its_last_acknowledged_report(tmp_path: Path) -> None:
    """The spec stays while the task runs and while any of its reports waits; the last acknowledgement of a
    finished task takes it, and what answers a re-delivery (state, attempt, results) stays."""
    async with open_store(tmp_path / "store.sqlite") as store:
        await add(store, "u")
        first = await store.record_result(progress("u", "Check"), state=TaskState.RUNNING, current_action="Backup")
        await store.acknowledge(first.seq)
        assert (await stored(store, "u")).spec == SPEC  # still running: its next action reads it
        last = await store.record_result(progress("u", "Backup", succ=False), state=TaskState.FINISHED)
        again = await store.append(route=ROUTE, job_uid="u", action="Backup", succ=False)
        await store.acknowledge(last.seq)
        assert (await stored(store, "u")).spec == SPEC  # a report still waits
        assert await store.acknowledge(again.seq)
        task = await stored(store, "u")
        assert (task.spec, task.state, task.attempt) == (b"", TaskState.FINISHED, 1)
        assert [(p.action, p.succ) for p in await store.progress("u")] == [("Check", True), ("Backup", False)]
        assert await add(store, "u") == (task, False)


async def test_a_finished_tasks_spec_also_leaves_when_its_last_report_is_dropped(tmp_path: Path) -> None:
    """A report the hub refused for good leaves the outbox as an acknowledged one does, taking the spec."""
    async with open_store(tmp_path / "store.sqlite") as store:
        await add(store, "u")
        report = await store.record_result(progress("u", "Check", succ=False), state=TaskState.FINISHED)
        assert await store.drop(report.seq, "job_gone: no such job")
        assert (await stored(store, "u")).spec == b""


async def test_a_refused_task_is_stored_finished_without_its_spec_and_its_failure_queued(tmp_path: Path) -> None:
    """Refused on arrival: one transaction stores the task finished with no spec, its failed result, and its
    report; a re-delivery finds it as it is; the store grows by far less than the spec."""
    async with open_store(tmp_path / "store.sqlite") as store:
        before = await store.used_bytes()
        task, new = await add(store, "u", refusal="too much request data")
        assert new
        assert (task.spec, task.state, task.current_action) == (b"", TaskState.FINISHED, "Check")
        assert await stored(store, "u") == task
        (result,) = await store.progress("u")
        assert (result.action, result.succ, result.reason) == ("Check", False, "too much request data")
        (report,) = await store.pending()
        assert (report.job_uid, report.action, report.succ, report.reason) == ("u", "Check", False, result.reason)
        assert report.finish_time == "2026-01-01T00:00:05Z"
        assert await add(store, "u") == (task, False)
        assert await store.used_bytes() - before < 64 << 10


async def test_pruning_forgets_the_specs_of_finished_tasks_an_older_agent_kept(tmp_path: Path) -> None:
    """Tasks finished and acknowledged while specs were kept lose theirs at the next pruning, however recent;
    running ones and ones with a report waiting keep theirs."""
    now = ticking_clock()
    async with open_store(tmp_path / "store.sqlite", now=now) as store:
        for uid in ("done", "waiting", "running"):
            await add(store, uid)
        done = await store.record_result(progress("done", "Check"), state=TaskState.FINISHED)
        await store.record_result(progress("waiting", "Check"), state=TaskState.FINISHED)
        await store.acknowledge(done.seq)
        # What an agent from before left: the report gone, the spec still there.
        with contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as older:
            older.execute("UPDATE node_tasks SET spec = ? WHERE job_uid = 'done'", (SPEC,))
        assert (await stored(store, "done")).spec == SPEC
        assert await store.prune_finished(now() - timedelta(days=7)) == 0
        assert [(await stored(store, uid)).spec for uid in ("done", "waiting", "running")] == [b"", SPEC, SPEC]
