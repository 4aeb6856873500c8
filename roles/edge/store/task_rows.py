"""The node tasks' tables in the edge store: each task the hub sent, how far it has come, and its actions' results.

Plain functions over an open connection, run by :class:`roles.edge.store.store.EdgeStore` in its worker
thread; each write is one transaction, so a failed one changes nothing. A result is recorded with
its report (:mod:`.outbox_rows`) in the same transaction, so a result is never left unreported.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any, Final

import msgspec

from roles.edge.store.outbox_rows import insert_report
from roles.edge.store.records import (
    NO_SPEC,
    ActionProgress,
    NodeTask,
    OutboxReport,
    TaskNotFoundError,
    TaskState,
    stamp,
    time_of,
)
from roles.edge.store.schema import transaction

__all__ = [
    "add_task",
    "get_task",
    "progress",
    "prune_finished",
    "record_result",
    "remove_task",
    "require_task",
    "set_task_state",
    "tasks",
]

_TASK_COLUMNS: Final = "job_uid, route, job_type, spec, run_action_id, received_at, state, current_action, attempt"


def _task(row: tuple[Any, ...]) -> NodeTask:
    uid, route, job_type, spec, run_action_id, received_at, state, action, attempt = row
    return NodeTask(
        job_uid=uid,
        route=route,
        job_type=job_type,
        spec=bytes(spec),
        run_action_id=run_action_id,
        received_at=time_of(received_at),
        state=TaskState(state),
        current_action=action,
        attempt=attempt,
    )


def get_task(conn: sqlite3.Connection, job_uid: str) -> NodeTask | None:
    """The stored node task with this job UID, if any."""
    row = conn.execute(f"SELECT {_TASK_COLUMNS} FROM node_tasks WHERE job_uid = ?", (job_uid,)).fetchone()
    return None if row is None else _task(row)


def require_task(conn: sqlite3.Connection, job_uid: str) -> NodeTask:
    """The stored node task with this job UID. Errors: :class:`TaskNotFoundError`."""
    task = get_task(conn, job_uid)
    if task is None:
        raise TaskNotFoundError(f"no node task with job UID {job_uid!r} is stored")
    return task


def _insert_result(conn: sqlite3.Connection, task: NodeTask, progress: ActionProgress) -> OutboxReport:
    """Record an action's result of ``task`` (replacing an earlier one of that action) and queue its report."""
    conn.execute(
        "INSERT INTO action_progress (job_uid, action, succ, finish_time, reason, extend)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_uid, action) DO UPDATE SET succ = excluded.succ,"
        " finish_time = excluded.finish_time, reason = excluded.reason, extend = excluded.extend",
        (progress.job_uid, progress.action, progress.succ, progress.finish_time, progress.reason, progress.extend),
    )
    return insert_report(
        conn,
        OutboxReport(
            seq=0,
            route=task.route,
            job_uid=progress.job_uid,
            action=progress.action,
            succ=progress.succ,
            finish_time=progress.finish_time,
            reason=progress.reason,
            extend=progress.extend,
            attempt=task.attempt,
        ),
    )


def add_task(conn: sqlite3.Connection, draft: NodeTask, *, refusal: str, finish_time: str) -> tuple[NodeTask, bool]:
    """Store ``draft`` (running, at its current action) in one transaction, unless the same or a later attempt
    is stored; returns the stored task and whether this call stored it. See
    :meth:`roles.edge.store.store.EdgeStore.add_task`."""
    with transaction(conn):
        existing = get_task(conn, draft.job_uid)
        if existing is not None and existing.attempt >= draft.attempt:
            return existing, False
        task = draft
        if existing is not None:
            conn.execute("DELETE FROM action_progress WHERE job_uid = ?", (task.job_uid,))
            conn.execute("DELETE FROM exclusive_hold WHERE job_uid = ?", (task.job_uid,))
            conn.execute("DELETE FROM node_tasks WHERE job_uid = ?", (task.job_uid,))
        if refusal:
            task = msgspec.structs.replace(task, spec=NO_SPEC, state=TaskState.FINISHED)
        conn.execute(
            f"INSERT INTO node_tasks ({_TASK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                task.job_uid,
                task.route,
                task.job_type,
                task.spec,
                task.run_action_id,
                stamp(task.received_at),
                str(task.state),
                task.current_action,
                task.attempt,
            ),
        )
        if refusal:
            failure = ActionProgress(
                job_uid=task.job_uid, action=task.current_action, succ=False, finish_time=finish_time, reason=refusal
            )
            _insert_result(conn, task, failure)
        return task, True


def tasks(conn: sqlite3.Connection, state: TaskState | None) -> tuple[NodeTask, ...]:
    """The stored node tasks (in ``state`` if given), oldest first."""
    where, args = ("WHERE state = ?", (str(state),)) if state is not None else ("", ())
    rows = conn.execute(f"SELECT {_TASK_COLUMNS} FROM node_tasks {where} ORDER BY received_at, rowid", args)
    return tuple(_task(row) for row in rows)


def set_task_state(conn: sqlite3.Connection, job_uid: str, state: TaskState, current_action: str) -> NodeTask:
    """Move a node task on without a result, in one transaction. Errors: :class:`TaskNotFoundError`."""
    with transaction(conn):
        task = require_task(conn, job_uid)
        conn.execute(
            "UPDATE node_tasks SET state = ?, current_action = ? WHERE job_uid = ?",
            (str(state), current_action, job_uid),
        )
    return msgspec.structs.replace(task, state=state, current_action=current_action)


def remove_task(conn: sqlite3.Connection, job_uid: str) -> bool:
    """Forget a node task with its progress and any exclusive hold it has; False if there was none."""
    return conn.execute("DELETE FROM node_tasks WHERE job_uid = ?", (job_uid,)).rowcount == 1


def prune_finished(conn: sqlite3.Connection, received_before: datetime) -> int:
    """Forget, in one transaction, the finished tasks received before ``received_before`` whose reports have
    all left the outbox and that hold no exclusive slot; how many."""
    with transaction(conn):
        # Also those a store from before specs were forgotten on acknowledgement still holds.
        conn.execute(
            "UPDATE node_tasks SET spec = ? WHERE state = ? AND spec != ?"
            " AND job_uid NOT IN (SELECT job_uid FROM outbox)",
            (NO_SPEC, str(TaskState.FINISHED), NO_SPEC),
        )
        return conn.execute(
            "DELETE FROM node_tasks WHERE state = ? AND received_at < ?"
            " AND job_uid NOT IN (SELECT job_uid FROM outbox)"
            " AND job_uid NOT IN (SELECT job_uid FROM exclusive_hold)",
            (str(TaskState.FINISHED), stamp(received_before)),
        ).rowcount


def record_result(
    conn: sqlite3.Connection,
    progress: ActionProgress,
    state: TaskState,
    current_action: str | None,
    attempt: int | None,
) -> OutboxReport:
    """Record an action's result, queue its report and move the task on, in one transaction.

    Errors: :class:`TaskNotFoundError`, also when the stored task is not at ``attempt`` (when given)."""
    with transaction(conn):
        task = require_task(conn, progress.job_uid)
        if attempt is not None and task.attempt != attempt:
            raise TaskNotFoundError(
                f"the node task of job UID {progress.job_uid!r} is at attempt {task.attempt}, not {attempt}"
            )
        report = _insert_result(conn, task, progress)
        conn.execute(
            "UPDATE node_tasks SET state = ?, current_action = ? WHERE job_uid = ?",
            (str(state), current_action or progress.action, progress.job_uid),
        )
    return report


def progress(conn: sqlite3.Connection, job_uid: str) -> tuple[ActionProgress, ...]:
    """The recorded results of a node task's actions, in the order they were first recorded."""
    rows = conn.execute(
        "SELECT action, succ, finish_time, reason, extend FROM action_progress WHERE job_uid = ? ORDER BY rowid",
        (job_uid,),
    )
    return tuple(
        ActionProgress(job_uid=job_uid, action=a, succ=bool(s), finish_time=f, reason=r, extend=e)
        for a, s, f, r, e in rows
    )
