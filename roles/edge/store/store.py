"""The edge agent's durable local store: one SQLite file in WAL mode.

It holds what must survive a restart of the agent, a reboot or a self-upgrade: the node tasks the
hub sent, each action's result, the outbox of reports not yet acknowledged by a hub, the one
upgrade-or-config-update that may run at a time (keadm's ``idempotency_record``, made durable and
tied to its task so it cannot outlive it), a few agent facts, and the cache of the node's cloud
objects (:mod:`roles.edge.store.cache_rows`; Secrets among them when the config allows, which is one
reason the file is its owner's only).

SQLite calls block, so every one runs in a worker thread. The store owns ONE connection, used by
one worker thread at a time: a ``CapacityLimiter(1)`` serializes the calls in arrival order
(anyio's limiters are fair). A call's thread is never abandoned: a cancelled caller waits until its
statement has committed or rolled back, so the file is never left mid-transaction.

Every SQLite failure surfaces as :class:`StoreError`, naming the file and what went wrong (disk
full, read-only, corrupt...). Each write is one transaction, so a failed write changes nothing.

The file itself - opening and checking it, its schema and migrations, and how SQLite's errors
become :class:`StoreError` - is :mod:`roles.edge.store.schema`'s.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, TypeVar, final

import anyio
import anyio.to_thread
import msgspec
import structlog

from roles.edge.store import cache_rows
from roles.edge.store.cache_rows import Deletion, Key, Replacement, Row, Written
from roles.edge.store.schema import SCHEMA_VERSION, StoreError, StoreFault, connect, store_error, transaction

__all__ = [
    "SCHEMA_VERSION",
    "ActionProgress",
    "DroppedReport",
    "EdgeStore",
    "ExclusiveHold",
    "NodeTask",
    "OutboxReport",
    "StoreError",
    "StoreFault",
    "TaskNotFoundError",
    "TaskState",
    "open_store",
    "quarantine_store",
]

T = TypeVar("T")

_DROPPED_KEPT: Final = 1000
"""How many dropped reports are kept for inspection; older ones are pruned as new ones arrive."""
_NO_SPEC: Final = b""
"""The spec of a task refused on arrival, and of a finished one once its reports have left the outbox."""


# ------------------------------------------------------------------------------------------ records


class TaskNotFoundError(LookupError):
    """No node task with this job UID is stored."""


class TaskState(StrEnum):
    """Where a received node task stands on this node."""

    RUNNING = "running"
    WAITING_CONFIRMATION = "waiting_confirmation"
    FINISHED = "finished"


class _Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the values the store returns."""


class NodeTask(_Record, frozen=True):
    """A node task as received from a hub (a RunAction), and how far it has come.

    A task is its job UID and its attempt (1 unless the job was retried); the store keeps the latest
    attempt of each job, which replaced the ones before it.
    """

    job_uid: str
    route: str
    job_type: str
    spec: bytes
    """The job's spec as the hub sent it (JSON); empty for a task refused on arrival, and for a finished one
    once its reports have left the outbox."""
    run_action_id: str
    received_at: datetime
    state: TaskState
    current_action: str
    attempt: int = 1

    @property
    def key(self) -> str:
        """What names this attempt's own records on the device (facts, backups, the launcher's marker):
        the job UID for attempt 1, as before retries existed, so an upgrade in flight across an agent
        upgrade finds its records; ``<uid>.attempt-<n>`` for a retry, which must not find attempt 1's."""
        return self.job_uid if self.attempt <= 1 else f"{self.job_uid}.attempt-{self.attempt}"


class ActionProgress(_Record, frozen=True):
    """The result of one action of one node task."""

    job_uid: str
    action: str
    succ: bool
    finish_time: str = ""
    """RFC 3339, as reported."""
    reason: str = ""
    extend: str = ""


class OutboxReport(_Record, frozen=True):
    """A report waiting for a hub's acknowledgement; ``seq`` is never reused by this store file."""

    seq: int
    route: str
    job_uid: str
    action: str
    succ: bool
    finish_time: str = ""
    reason: str = ""
    extend: str = ""
    attempt: int = 0
    """The attempt the result belongs to; 0 for a report queued by an agent that knew no attempts."""


class DroppedReport(_Record, frozen=True):
    """A report given up on (the hub refused it for good), kept for inspection."""

    report: OutboxReport
    reason: str
    dropped_at: datetime


class ExclusiveHold(_Record, frozen=True):
    """The node task currently running an upgrade or config update on this node."""

    job_uid: str
    route: str
    kind: str
    since: datetime

    def describe(self) -> str:
        """A human description of the holder, for a refusal's reason."""
        return f"{self.kind} {self.route} (job {self.job_uid}) since {self.since.isoformat()}"


# --------------------------------------------------------------------------------------------- store


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _stamp(moment: datetime) -> str:
    # One zone for every stored time, so that their text sorts as the times do.
    return moment.astimezone(UTC).isoformat()


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


_TASK_COLUMNS: Final = "job_uid, route, job_type, spec, run_action_id, received_at, state, current_action, attempt"
_REPORT_COLUMNS: Final = "seq, route, job_uid, action, succ, finish_time, reason, extend, attempt"
_REPORT_FIELDS: Final = len(_REPORT_COLUMNS.split(","))


def _task(row: tuple[Any, ...]) -> NodeTask:
    uid, route, job_type, spec, run_action_id, received_at, state, action, attempt = row
    return NodeTask(
        job_uid=uid,
        route=route,
        job_type=job_type,
        spec=bytes(spec),
        run_action_id=run_action_id,
        received_at=_time(received_at),
        state=TaskState(state),
        current_action=action,
        attempt=attempt,
    )


def _report(row: tuple[Any, ...]) -> OutboxReport:
    seq, route, uid, action, succ, finish_time, reason, extend, attempt = row
    return OutboxReport(
        seq=seq,
        route=route,
        job_uid=uid,
        action=action,
        succ=bool(succ),
        finish_time=finish_time,
        reason=reason,
        extend=extend,
        attempt=attempt,
    )


def _get_task(conn: sqlite3.Connection, job_uid: str) -> NodeTask | None:
    row = conn.execute(f"SELECT {_TASK_COLUMNS} FROM node_tasks WHERE job_uid = ?", (job_uid,)).fetchone()
    return None if row is None else _task(row)


def _require_task(conn: sqlite3.Connection, job_uid: str) -> NodeTask:
    task = _get_task(conn, job_uid)
    if task is None:
        raise TaskNotFoundError(f"no node task with job UID {job_uid!r} is stored")
    return task


def _insert_report(conn: sqlite3.Connection, report: OutboxReport) -> OutboxReport:
    cursor = conn.execute(
        "INSERT INTO outbox (route, job_uid, action, succ, finish_time, reason, extend, attempt)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            report.route,
            report.job_uid,
            report.action,
            report.succ,
            report.finish_time,
            report.reason,
            report.extend,
            report.attempt,
        ),
    )
    assert cursor.lastrowid is not None
    return msgspec.structs.replace(report, seq=cursor.lastrowid)


def _insert_result(conn: sqlite3.Connection, task: NodeTask, progress: ActionProgress) -> OutboxReport:
    """Record an action's result of ``task`` (replacing an earlier one of that action) and queue its report."""
    conn.execute(
        "INSERT INTO action_progress (job_uid, action, succ, finish_time, reason, extend)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_uid, action) DO UPDATE SET succ = excluded.succ,"
        " finish_time = excluded.finish_time, reason = excluded.reason, extend = excluded.extend",
        (progress.job_uid, progress.action, progress.succ, progress.finish_time, progress.reason, progress.extend),
    )
    return _insert_report(
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


def _report_left(conn: sqlite3.Connection, seq: int) -> None:
    """Take report ``seq`` out of the outbox; once its task has finished and has no report left, forget its spec.

    A finished task is never walked again: what answers its RunAction again (its state, attempt and
    results) stays, but its spec (a Task's request data, up to a hub's 768 KiB) would only take room
    until the task's retention ends.
    """
    row = conn.execute("SELECT job_uid FROM outbox WHERE seq = ?", (seq,)).fetchone()
    conn.execute("DELETE FROM outbox WHERE seq = ?", (seq,))
    if row is not None:
        conn.execute(
            "UPDATE node_tasks SET spec = ? WHERE job_uid = ? AND state = ? AND spec != ?"
            " AND NOT EXISTS (SELECT 1 FROM outbox WHERE job_uid = ?)",
            (_NO_SPEC, row[0], str(TaskState.FINISHED), _NO_SPEC, row[0]),
        )


@final
class EdgeStore:
    """The agent's durable state. Make one with :func:`open_store`; all methods are safe to call concurrently.

    Errors: every method raises :class:`StoreError` when SQLite fails, and ``anyio.ClosedResourceError``
    once the store is closed. A failed write leaves the store exactly as it was.

    Cancellation: a call whose statement has started completes (commits or rolls back) before the
    cancellation is delivered.
    """

    def __init__(self, conn: sqlite3.Connection, *, path: Path, now: Callable[[], datetime]) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._limiter = anyio.CapacityLimiter(1)
        self._now = now
        self.path = path

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            conn = self._conn
            if conn is None:
                raise anyio.ClosedResourceError
            try:
                return fn(conn)
            except (sqlite3.Error, OSError) as exc:
                raise store_error(self.path, exc) from exc

        return await anyio.to_thread.run_sync(run, limiter=self._limiter)

    async def aclose(self) -> None:
        """Close the connection (SQLite checkpoints the WAL into the file). Idempotent."""

        def close() -> None:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(close, limiter=self._limiter)

    # ------------------------------------------------------------------------------- node tasks

    async def add_task(
        self,
        *,
        job_uid: str,
        route: str,
        job_type: str,
        spec: bytes,
        run_action_id: str,
        action: str,
        attempt: int = 1,
        refusal: str = "",
        finish_time: str = "",
    ) -> tuple[NodeTask, bool]:
        """Store a received node task, starting at ``action``; returns the stored task and whether this call
        stored it.

        A task already known by its job UID and ``attempt`` is left as it is (a re-delivered
        RunAction), as is one at a later attempt (this RunAction is stale). A later attempt (a retry)
        replaces the stored one: its results and any exclusive hold go with it, in the same
        transaction. The caller stops walking the replaced attempt first.

        With ``refusal``, a task this call stores is stored finished, without its spec: ``action``
        failed with ``refusal`` as its reason (at ``finish_time``) and its report is queued, all in the
        same transaction. What a refused task keeps is what answers its RunAction again."""
        received_at = self._now()

        def op(conn: sqlite3.Connection) -> tuple[NodeTask, bool]:
            with transaction(conn):
                existing = _get_task(conn, job_uid)
                if existing is not None and existing.attempt >= attempt:
                    return existing, False
                task = NodeTask(
                    job_uid=job_uid,
                    route=route,
                    job_type=job_type,
                    spec=spec,
                    run_action_id=run_action_id,
                    received_at=received_at,
                    state=TaskState.RUNNING,
                    current_action=action,
                    attempt=attempt,
                )
                if existing is not None:
                    conn.execute("DELETE FROM action_progress WHERE job_uid = ?", (job_uid,))
                    conn.execute("DELETE FROM exclusive_hold WHERE job_uid = ?", (job_uid,))
                    conn.execute("DELETE FROM node_tasks WHERE job_uid = ?", (job_uid,))
                if refusal:
                    task = msgspec.structs.replace(task, spec=_NO_SPEC, state=TaskState.FINISHED)
                conn.execute(
                    f"INSERT INTO node_tasks ({_TASK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        job_uid,
                        route,
                        job_type,
                        task.spec,
                        run_action_id,
                        _stamp(received_at),
                        str(task.state),
                        action,
                        attempt,
                    ),
                )
                if refusal:
                    failure = ActionProgress(
                        job_uid=job_uid, action=action, succ=False, finish_time=finish_time, reason=refusal
                    )
                    _insert_result(conn, task, failure)
                return task, True

        return await self._call(op)

    async def get_task(self, job_uid: str) -> NodeTask | None:
        """The stored node task with this job UID, if any."""
        return await self._call(lambda conn: _get_task(conn, job_uid))

    async def tasks(self, state: TaskState | None = None) -> tuple[NodeTask, ...]:
        """The stored node tasks (in ``state`` if given), oldest first."""

        def op(conn: sqlite3.Connection) -> tuple[NodeTask, ...]:
            where, args = ("WHERE state = ?", (str(state),)) if state is not None else ("", ())
            rows = conn.execute(f"SELECT {_TASK_COLUMNS} FROM node_tasks {where} ORDER BY received_at, rowid", args)
            return tuple(_task(row) for row in rows)

        return await self._call(op)

    async def set_task_state(self, job_uid: str, *, state: TaskState, current_action: str) -> NodeTask:
        """Move a node task on without a result (e.g. resumed after confirmation).

        Errors: :class:`TaskNotFoundError`."""

        def op(conn: sqlite3.Connection) -> NodeTask:
            with transaction(conn):
                task = _require_task(conn, job_uid)
                conn.execute(
                    "UPDATE node_tasks SET state = ?, current_action = ? WHERE job_uid = ?",
                    (str(state), current_action, job_uid),
                )
            return msgspec.structs.replace(task, state=state, current_action=current_action)

        return await self._call(op)

    async def remove_task(self, job_uid: str) -> bool:
        """Forget a node task with its progress and any exclusive hold it has; its reports stay in the outbox."""
        return await self._call(
            lambda conn: conn.execute("DELETE FROM node_tasks WHERE job_uid = ?", (job_uid,)).rowcount == 1
        )

    async def prune_finished(self, received_before: datetime) -> int:
        """Forget the finished tasks received before ``received_before``, with their progress; how many.

        A task whose reports still wait for a hub's acknowledgement, or that holds the node's
        exclusive slot, is kept: the first is still needed to answer the hub's RunAction again, the
        second to release the slot when the work it guards is proven.
        """

        def op(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                # Also those a store from before specs were forgotten on acknowledgement still holds.
                conn.execute(
                    "UPDATE node_tasks SET spec = ? WHERE state = ? AND spec != ?"
                    " AND job_uid NOT IN (SELECT job_uid FROM outbox)",
                    (_NO_SPEC, str(TaskState.FINISHED), _NO_SPEC),
                )
                return conn.execute(
                    "DELETE FROM node_tasks WHERE state = ? AND received_at < ?"
                    " AND job_uid NOT IN (SELECT job_uid FROM outbox)"
                    " AND job_uid NOT IN (SELECT job_uid FROM exclusive_hold)",
                    (str(TaskState.FINISHED), _stamp(received_before)),
                ).rowcount

        return await self._call(op)

    # --------------------------------------------------------------------------------- progress

    async def record_result(
        self,
        progress: ActionProgress,
        *,
        state: TaskState,
        current_action: str | None = None,
        attempt: int | None = None,
    ) -> OutboxReport:
        """Record an action's result, queue its report and move the task to ``state`` (and ``current_action``,
        default the action reported), all in one transaction; the report names the task's attempt.

        Errors: :class:`TaskNotFoundError`, also when the stored task is not at ``attempt`` (when given):
        a retry replaced it, and this result belongs to nothing stored any more."""

        def op(conn: sqlite3.Connection) -> OutboxReport:
            with transaction(conn):
                task = _require_task(conn, progress.job_uid)
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

        return await self._call(op)

    async def progress(self, job_uid: str) -> tuple[ActionProgress, ...]:
        """The recorded results of a node task's actions, in the order they were first recorded."""

        def op(conn: sqlite3.Connection) -> tuple[ActionProgress, ...]:
            rows = conn.execute(
                "SELECT action, succ, finish_time, reason, extend FROM action_progress"
                " WHERE job_uid = ? ORDER BY rowid",
                (job_uid,),
            )
            return tuple(
                ActionProgress(job_uid=job_uid, action=a, succ=bool(s), finish_time=f, reason=r, extend=e)
                for a, s, f, r, e in rows
            )

        return await self._call(op)

    # ----------------------------------------------------------------------------------- outbox

    async def append(
        self,
        *,
        route: str,
        job_uid: str,
        action: str,
        succ: bool,
        finish_time: str = "",
        reason: str = "",
        extend: str = "",
        attempt: int = 0,
    ) -> OutboxReport:
        """Queue a report not tied to a stored result (use :meth:`record_result` for those); returns it with its seq."""
        draft = OutboxReport(
            seq=0,
            route=route,
            job_uid=job_uid,
            action=action,
            succ=succ,
            finish_time=finish_time,
            reason=reason,
            extend=extend,
            attempt=attempt,
        )
        return await self._call(lambda conn: _insert_report(conn, draft))

    async def pending(self, *, after: int = 0, limit: int | None = None) -> tuple[OutboxReport, ...]:
        """The unacknowledged reports with a seq above ``after``, in seq order (at most ``limit``)."""

        def op(conn: sqlite3.Connection) -> tuple[OutboxReport, ...]:
            rows = conn.execute(
                f"SELECT {_REPORT_COLUMNS} FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, -1 if limit is None else limit),
            )
            return tuple(_report(row) for row in rows)

        return await self._call(op)

    async def used_bytes(self) -> int:
        """Bytes of the store's file in use, free pages not counted: what ``storeQuotaBytes`` is measured against."""

        def op(conn: sqlite3.Connection) -> int:
            pages: int = conn.execute("PRAGMA page_count").fetchone()[0]
            free: int = conn.execute("PRAGMA freelist_count").fetchone()[0]
            size: int = conn.execute("PRAGMA page_size").fetchone()[0]
            return (pages - free) * size

        return await self._call(op)

    async def outbox_depth(self) -> int:
        """How many reports wait for a hub's acknowledgement."""
        return await self._call(lambda conn: int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]))

    async def acknowledge(self, seq: int) -> bool:
        """Forget a report a hub has durably applied; False if it was not pending (a repeated ack). The last
        report of a finished task takes the task's spec with it."""

        def op(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                pending = conn.execute("SELECT 1 FROM outbox WHERE seq = ?", (seq,)).fetchone() is not None
                _report_left(conn, seq)
            return pending

        return await self._call(op)

    async def drop(self, seq: int, reason: str) -> bool:
        """Give up on a report a hub refused for good; it moves to the dropped reports. False if not pending."""
        dropped_at = _stamp(self._now())

        def op(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                moved = conn.execute(
                    f"INSERT INTO dropped_reports ({_REPORT_COLUMNS}, drop_reason, dropped_at)"
                    f" SELECT {_REPORT_COLUMNS}, ?, ? FROM outbox WHERE seq = ?",
                    (reason, dropped_at, seq),
                ).rowcount
                _report_left(conn, seq)
                conn.execute(
                    "DELETE FROM dropped_reports WHERE seq NOT IN"
                    " (SELECT seq FROM dropped_reports ORDER BY seq DESC LIMIT ?)",
                    (_DROPPED_KEPT,),
                )
            return moved == 1

        return await self._call(op)

    async def dropped(self) -> tuple[DroppedReport, ...]:
        """The most recently dropped reports, in seq order."""

        def op(conn: sqlite3.Connection) -> tuple[DroppedReport, ...]:
            rows = conn.execute(f"SELECT {_REPORT_COLUMNS}, drop_reason, dropped_at FROM dropped_reports ORDER BY seq")
            return tuple(
                DroppedReport(
                    report=_report(row[:_REPORT_FIELDS]),
                    reason=row[_REPORT_FIELDS],
                    dropped_at=_time(row[_REPORT_FIELDS + 1]),
                )
                for row in rows
            )

        return await self._call(op)

    # ------------------------------------------------------------------------ exclusive operation

    async def try_begin_exclusive(self, job_uid: str, kind: str) -> str | None:
        """Take the node's one upgrade-or-config-update slot for a stored task: None when taken (or already
        held by this task, as after a restart), else the holder's description. Errors: :class:`TaskNotFoundError`."""
        since = _stamp(self._now())

        def op(conn: sqlite3.Connection) -> str | None:
            with transaction(conn):
                _require_task(conn, job_uid)
                holder = _hold(conn)
                if holder is not None:
                    return None if holder.job_uid == job_uid else holder.describe()
                conn.execute(
                    "INSERT INTO exclusive_hold (slot, job_uid, kind, since) VALUES ('node', ?, ?, ?)",
                    (job_uid, kind, since),
                )
                return None

        return await self._call(op)

    async def end_exclusive(self, job_uid: str) -> bool:
        """Release the slot if this task holds it; False otherwise."""
        return await self._call(
            lambda conn: conn.execute("DELETE FROM exclusive_hold WHERE job_uid = ?", (job_uid,)).rowcount == 1
        )

    async def exclusive_hold(self) -> ExclusiveHold | None:
        """Who holds the slot, if anyone."""
        return await self._call(_hold)

    # -------------------------------------------------------------------------------------- cache

    async def cache_upsert(self, kind: str, rows: tuple[Row, ...]) -> tuple[Written | None, ...]:
        """Add or update cached objects of ``kind`` in one transaction (:func:`cache_rows.upsert`)."""
        return await self._call(lambda conn: cache_rows.upsert(conn, kind, rows))

    async def cache_delete(self, kind: str, namespace: str, name: str, version: int | None) -> Deletion:
        """Remove a cached object deleted at ``version`` (:func:`cache_rows.delete`)."""
        return await self._call(lambda conn: cache_rows.delete(conn, kind, namespace, name, version))

    async def cache_replace(self, kind: str, rows: tuple[Row, ...], version: int | None) -> Replacement:
        """Swap the collection of ``kind`` for a fresh list in one transaction (:func:`cache_rows.replace`)."""
        return await self._call(lambda conn: cache_rows.replace(conn, kind, rows, version))

    async def cache_stage(self, kind: str, rows: tuple[Row, ...], *, first: bool) -> None:
        """Stage a chunk of a replace of ``kind`` in one transaction (:func:`cache_rows.stage`)."""
        await self._call(lambda conn: cache_rows.stage(conn, kind, rows, first=first))

    async def cache_replace_staged(
        self, kind: str, rows: tuple[Row, ...], version: int | None, keep: frozenset[Key], *, first: bool
    ) -> Replacement:
        """Swap the collection of ``kind`` for the staged chunks and the last one, ``rows``, in one transaction
        (:func:`cache_rows.replace_staged`)."""
        return await self._call(lambda conn: cache_rows.replace_staged(conn, kind, rows, version, keep, first=first))

    async def cache_unstage(self, kind: str | None = None) -> int:
        """Drop what was staged for ``kind`` (None: every kind); how many rows there were."""
        return await self._call(lambda conn: cache_rows.unstage(conn, kind))

    async def cache_staged_keys(self, kind: str) -> tuple[Key, ...]:
        """``(namespace, name)`` of every row staged for ``kind``."""
        return await self._call(lambda conn: cache_rows.staged_keys(conn, kind))

    async def cache_purge(self, kind: str) -> int:
        """Forget every cached object of ``kind``; how many there were."""
        return await self._call(lambda conn: cache_rows.purge(conn, kind))

    async def cache_get(self, kind: str, namespace: str, name: str) -> bytes | None:
        """A cached object's JSON, or None."""
        return await self._call(lambda conn: cache_rows.get(conn, kind, namespace, name))

    async def cache_list(self, kind: str, namespace: str) -> tuple[tuple[bytes, ...], int]:
        """The cached objects of ``kind`` in ``namespace`` (``""``: all), and the kind's resource version."""
        return await self._call(lambda conn: cache_rows.listing(conn, kind, namespace))

    async def cache_keys(self, kind: str) -> tuple[tuple[str, str], ...]:
        """``(namespace, name)`` of every cached object of ``kind``."""
        return await self._call(lambda conn: cache_rows.keys(conn, kind))

    # -------------------------------------------------------------------------------------- facts

    async def set_fact(self, key: str, value: Any) -> None:
        """Store a fact about the agent (any msgspec-encodable value) under ``key``, replacing the old one."""
        encoded = msgspec.json.encode(value)
        updated_at = _stamp(self._now())
        await self._call(
            lambda conn: conn.execute(
                "INSERT INTO agent_facts (key, value, updated_at) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE"
                " SET value = excluded.value, updated_at = excluded.updated_at",
                (key, encoded, updated_at),
            )
        )

    async def get_fact(self, key: str, type_: type[T]) -> T | None:
        """The fact under ``key`` decoded as ``type_``, or None. Errors: :class:`StoreError` if it is not one."""
        row = await self._call(
            lambda conn: conn.execute("SELECT value FROM agent_facts WHERE key = ?", (key,)).fetchone()
        )
        if row is None:
            return None
        try:
            return msgspec.json.decode(row[0], type=type_)
        except msgspec.DecodeError as exc:
            raise StoreError(self.path, StoreFault.SCHEMA, f"fact {key!r}: {exc}") from exc

    async def delete_fact(self, key: str) -> bool:
        """Forget a fact; False if there was none."""
        return await self._call(
            lambda conn: conn.execute("DELETE FROM agent_facts WHERE key = ?", (key,)).rowcount == 1
        )


def _hold(conn: sqlite3.Connection) -> ExclusiveHold | None:
    row = conn.execute(
        "SELECT h.job_uid, t.route, h.kind, h.since FROM exclusive_hold h JOIN node_tasks t USING (job_uid)"
    ).fetchone()
    if row is None:
        return None
    return ExclusiveHold(job_uid=row[0], route=row[1], kind=row[2], since=_time(row[3]))


@contextlib.asynccontextmanager
async def open_store(
    path: str | os.PathLike[str],
    *,
    now: Callable[[], datetime] = _utc_now,
    max_bytes: int | None = None,
    log: structlog.typing.FilteringBoundLogger | None = None,
) -> AsyncIterator[EdgeStore]:
    """Open (or create) the store at ``path``, migrating its schema, and close it on exit.

    ``now`` stamps received, dropped and updated times (pass ``Clock.now`` for loop-derived time);
    ``max_bytes`` caps the file's size, beyond which writes fail as on a full disk.

    Errors: :class:`StoreError` when the file cannot be opened, is corrupt (``fault`` CORRUPT: see
    :func:`quarantine_store`) or has a schema this agent cannot read.
    """
    file = Path(path)
    logger = log if log is not None else structlog.get_logger()

    def open_file() -> tuple[sqlite3.Connection, int]:
        try:
            return connect(file, max_bytes)
        except (sqlite3.Error, OSError) as exc:
            raise store_error(file, exc) from exc

    conn, found = await anyio.to_thread.run_sync(open_file)
    store = EdgeStore(conn, path=file, now=now)
    logger.info("store_opened", path=str(file), found_version=found, schema_version=max(found, SCHEMA_VERSION))
    try:
        yield store
    finally:
        await store.aclose()


async def quarantine_store(
    path: str | os.PathLike[str],
    *,
    now: Callable[[], datetime] = _utc_now,
    log: structlog.typing.FilteringBoundLogger | None = None,
) -> Path:
    """Move a corrupt store (with its -wal and -shm files) aside so that a fresh one can be created; returns
    the new name of the main file. For a role that met ``StoreFault.CORRUPT`` and must not crash-loop on it.
    """
    file = Path(path)
    suffix = now().astimezone(UTC).strftime(".corrupt-%Y%m%dT%H%M%SZ")
    target = file.with_name(file.name + suffix)

    def move() -> None:
        for extra in ("-wal", "-shm"):
            side = file.with_name(file.name + extra)
            if side.exists():
                side.replace(target.with_name(target.name + extra))
        file.replace(target)

    try:
        await anyio.to_thread.run_sync(move)
    except OSError as exc:
        raise StoreError(file, StoreFault.CANNOT_OPEN, f"cannot move it aside: {exc}") from exc
    (log if log is not None else structlog.get_logger()).warning(
        "store_quarantined", path=str(file), moved_to=str(target)
    )
    return target
