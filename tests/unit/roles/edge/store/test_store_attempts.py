"""The edge store keys a node task by job UID and attempt, and a store of the first schema keeps working."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from roles.edge.checks.checks import Thresholds
from roles.edge.context import TaskContext
from roles.edge.store.records import ActionProgress, NodeTask, TaskNotFoundError, TaskState
from roles.edge.store.schema import SCHEMA_VERSION
from roles.edge.store.store import EdgeStore, open_store
from roles.edge.upgrade import upgrade
from schemas.v1alpha2 import NodeUpgradeJobSpec

ROUTE = "operations.kubeedge.io/v1alpha2/imageprepulljob/pp/nodes/edge-1"


async def add(store: EdgeStore, attempt: int, *, run_action_id: str = "r") -> tuple[NodeTask, bool]:
    return await store.add_task(
        job_uid="u1",
        route=ROUTE,
        job_type="imageprepulljob",
        spec=f'{{"attempt":{attempt}}}'.encode(),
        run_action_id=run_action_id,
        action="Check",
        attempt=attempt,
    )


def result(action: str, *, succ: bool = True) -> ActionProgress:
    return ActionProgress(job_uid="u1", action=action, succ=succ, finish_time="2026-01-01T00:00:05Z")


async def test_a_later_attempt_replaces_the_task_and_its_results_while_redeliveries_change_nothing(
    tmp_path: Path,
) -> None:
    """Attempt 2 is stored as new work, with no results and no hold; attempt 2 again, or 1 late, is not new."""
    async with open_store(tmp_path / "s.sqlite") as store:
        first, _ = await add(store, 1)
        await store.record_result(result("Check"), state=TaskState.RUNNING, current_action="Pull", attempt=1)
        await store.record_result(result("Pull", succ=False), state=TaskState.FINISHED, attempt=1)
        assert await store.try_begin_exclusive("u1", "imageprepulljob") is None

        retried, new = await add(store, 2, run_action_id="r2")
        assert new
        assert (retried.attempt, retried.state, retried.current_action, retried.spec) == (
            2,
            TaskState.RUNNING,
            "Check",
            b'{"attempt":2}',
        )
        assert await store.get_task("u1") == retried
        assert await store.progress("u1") == ()
        assert await store.exclusive_hold() is None

        for attempt in (2, 1):
            again, new = await add(store, attempt, run_action_id="late")
            assert (again, new) == (retried, False)
        assert first.key == "u1"
        assert retried.key == "u1.attempt-2"


async def test_reports_name_their_attempt_and_a_replaced_attempt_records_nothing(tmp_path: Path) -> None:
    """A result is queued with its task's attempt; one recorded for an attempt a retry replaced is refused."""
    async with open_store(tmp_path / "s.sqlite") as store:
        await add(store, 1)
        first = await store.record_result(result("Check"), state=TaskState.RUNNING, current_action="Pull")
        await add(store, 2)
        with pytest.raises(TaskNotFoundError, match="is at attempt 2, not 1"):
            await store.record_result(result("Pull"), state=TaskState.FINISHED, attempt=1)
        second = await store.record_result(result("Check"), state=TaskState.RUNNING, current_action="Pull", attempt=2)
        assert [(r.seq, r.action, r.attempt) for r in await store.pending()] == [
            (first.seq, "Check", 1),
            (2, "Check", 2),
        ]
        assert second.attempt == 2
        dropped = await store.drop(second.seq, "job_gone: x")
        assert dropped
        assert [(d.report.attempt, d.reason) for d in await store.dropped()] == [(2, "job_gone: x")]


# The first schema's statements and the first agent's SQL, verbatim: what an agent of that version
# ran against its store, and still runs if it is rolled back onto a store this version migrated.
_SCHEMA_1 = (
    "CREATE TABLE store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE node_tasks (
        job_uid TEXT PRIMARY KEY, route TEXT NOT NULL, job_type TEXT NOT NULL, spec BLOB NOT NULL,
        run_action_id TEXT NOT NULL, received_at TEXT NOT NULL, state TEXT NOT NULL,
        current_action TEXT NOT NULL)""",
    """CREATE TABLE action_progress (
        job_uid TEXT NOT NULL REFERENCES node_tasks (job_uid) ON DELETE CASCADE,
        action TEXT NOT NULL, succ INTEGER NOT NULL, finish_time TEXT NOT NULL, reason TEXT NOT NULL,
        extend TEXT NOT NULL, PRIMARY KEY (job_uid, action))""",
    """CREATE TABLE outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT NOT NULL, job_uid TEXT NOT NULL,
        action TEXT NOT NULL, succ INTEGER NOT NULL, finish_time TEXT NOT NULL, reason TEXT NOT NULL,
        extend TEXT NOT NULL)""",
    """CREATE TABLE dropped_reports (
        seq INTEGER PRIMARY KEY, route TEXT NOT NULL, job_uid TEXT NOT NULL, action TEXT NOT NULL,
        succ INTEGER NOT NULL, finish_time TEXT NOT NULL, reason TEXT NOT NULL, extend TEXT NOT NULL,
        drop_reason TEXT NOT NULL, dropped_at TEXT NOT NULL)""",
    """CREATE TABLE exclusive_hold (
        slot TEXT PRIMARY KEY CHECK (slot = 'node'),
        job_uid TEXT NOT NULL REFERENCES node_tasks (job_uid) ON DELETE CASCADE,
        kind TEXT NOT NULL, since TEXT NOT NULL)""",
    "CREATE TABLE agent_facts (key TEXT PRIMARY KEY, value BLOB NOT NULL, updated_at TEXT NOT NULL)",
    "INSERT INTO store_meta (key, value) VALUES ('oldest_reader', '1')",
    "PRAGMA user_version = 1",
)
_V1_TASK_COLUMNS = "job_uid, route, job_type, spec, run_action_id, received_at, state, current_action"
_V1_REPORT_COLUMNS = "seq, route, job_uid, action, succ, finish_time, reason, extend"


def _v1_agent_writes(conn: sqlite3.Connection, uid: str) -> None:
    conn.execute(
        f"INSERT INTO node_tasks ({_V1_TASK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (uid, ROUTE, "imageprepulljob", b"{}", "r1", "2026-01-01T00:00:00+00:00", "running", "Pull"),
    )
    conn.execute(
        "INSERT INTO action_progress (job_uid, action, succ, finish_time, reason, extend) VALUES (?, ?, ?, ?, ?, ?)",
        (uid, "Check", True, "t", "", ""),
    )
    conn.execute(
        "INSERT INTO outbox (route, job_uid, action, succ, finish_time, reason, extend) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (ROUTE, uid, "Check", True, "t", "", ""),
    )


async def test_a_store_of_the_first_schema_is_migrated_in_place_and_its_tasks_are_first_attempts(
    tmp_path: Path,
) -> None:
    """An agent upgraded onto its old store finds every task at attempt 1 and its queued reports unattributed."""
    path = tmp_path / "store.sqlite"
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for statement in _SCHEMA_1:
            conn.execute(statement)
        _v1_agent_writes(conn, "old")
    conn.close()

    async with open_store(path) as store:
        task = await store.get_task("old")
        assert task is not None
        assert (task.attempt, task.key, task.current_action) == (1, "old", "Pull")
        assert [p.action for p in await store.progress("old")] == ["Check"]
        (queued,) = await store.pending()
        assert (queued.job_uid, queued.action, queued.attempt) == ("old", "Check", 0)
        again, new = await store.add_task(
            job_uid="old", route=ROUTE, job_type="imageprepulljob", spec=b"{}", run_action_id="r", action="Check"
        )
        assert (again, new) == (task, False)  # a re-delivered first attempt, as before the migration

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        assert conn.execute("SELECT value FROM store_meta WHERE key = 'oldest_reader'").fetchone()[0] == "1"
    conn.close()


async def test_an_agent_of_the_first_schema_rolled_back_onto_a_migrated_store_still_reads_and_writes_it(
    tmp_path: Path,
) -> None:
    """The first agent's own statements work on the migrated file: its rows get attempt 1 and reports attempt 0."""
    path = tmp_path / "store.sqlite"
    async with open_store(path) as store:
        await add(store, 2)
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        _v1_agent_writes(conn, "written-by-v1")
        rows = conn.execute(f"SELECT {_V1_TASK_COLUMNS} FROM node_tasks ORDER BY received_at, rowid").fetchall()
        assert [r[0] for r in rows] == ["written-by-v1", "u1"]
        conn.execute(
            f"INSERT INTO dropped_reports ({_V1_REPORT_COLUMNS}, drop_reason, dropped_at)"
            f" SELECT {_V1_REPORT_COLUMNS}, ?, ? FROM outbox WHERE seq = ?",
            ("job_gone: x", "2026-01-01T00:00:00+00:00", 1),
        )
        conn.execute("DELETE FROM outbox WHERE seq = 1")
        conn.execute("DELETE FROM node_tasks WHERE job_uid = 'written-by-v1'")
    conn.close()

    async with open_store(path) as store:
        retried = await store.get_task("u1")
        assert retried is not None
        assert retried.attempt == 2  # untouched by the older agent
        (dropped,) = await store.dropped()
        assert (dropped.report.job_uid, dropped.report.attempt) == ("written-by-v1", 0)
        assert await store.progress("written-by-v1") == ()  # went with its task (ON DELETE CASCADE)


async def test_a_retried_upgrade_starts_afresh_instead_of_finding_the_first_attempts_rollback(tmp_path: Path) -> None:
    """Attempt 1's Upgrade progress (rolled back) is its own: attempt 2's Upgrade does not read it as its own."""
    async with open_store(tmp_path / "s.sqlite") as store:
        first, _ = await add(store, 1)
        progress = {"stage": "rolled_back", "from_version": "v0.1.0", "to_version": "v0.2.0", "previous": ""}
        await store.set_fact(f"node_upgrade/{first.key}", progress)
        retried, _ = await add(store, 2)

        def context(task: NodeTask) -> TaskContext:
            spec = NodeUpgradeJobSpec(version="v0.1.0", node_names=("edge-1",))
            return TaskContext(
                task=task,
                spec=spec,
                node="edge-1",
                version="v0.1.0",
                data_dir=tmp_path,
                thresholds=Thresholds(),
                store=store,
            )

        assert not (await upgrade.upgrade(context(first))).succ  # attempt 1 finds its rollback
        outcome = await upgrade.upgrade(context(retried))  # attempt 2 finds nothing: already at the version
        assert (outcome.succ, outcome.extend) == (True, "v0.1.0,v0.1.0")
