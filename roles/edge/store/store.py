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
become :class:`StoreError` - is :mod:`roles.edge.store.schema`'s; the values it returns are
:mod:`roles.edge.store.records`'; each group of tables has its module of plain functions over the
connection, which this store runs: :mod:`~roles.edge.store.task_rows` (node tasks and their results),
:mod:`~roles.edge.store.outbox_rows` (reports), :mod:`~roles.edge.store.hold_rows` (the exclusive
hold), :mod:`~roles.edge.store.cache_rows` (cached objects) and :mod:`~roles.edge.store.fact_rows`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, final

import anyio
import anyio.to_thread
import msgspec
import structlog

from roles.edge.store import cache_rows, count_rows, fact_rows, hold_rows, outbox_rows, task_rows
from roles.edge.store.cache_rows import Deletion, Kept, Key, Replacement, Row, Written
from roles.edge.store.records import (
    ActionProgress,
    DroppedReport,
    ExclusiveHold,
    NodeTask,
    OutboxReport,
    StoreCounts,
    TaskState,
    stamp,
    utc_now,
)
from roles.edge.store.schema import SCHEMA_VERSION, StoreError, StoreFault, connect, store_error

__all__ = ["SCHEMA_VERSION", "EdgeStore", "StoreError", "StoreFault", "open_store", "quarantine_store"]

T = TypeVar("T")


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
        draft = NodeTask(
            job_uid=job_uid,
            route=route,
            job_type=job_type,
            spec=spec,
            run_action_id=run_action_id,
            received_at=self._now(),
            state=TaskState.RUNNING,
            current_action=action,
            attempt=attempt,
        )
        return await self._call(lambda conn: task_rows.add_task(conn, draft, refusal=refusal, finish_time=finish_time))

    async def get_task(self, job_uid: str) -> NodeTask | None:
        """The stored node task with this job UID, if any."""
        return await self._call(lambda conn: task_rows.get_task(conn, job_uid))

    async def tasks(self, state: TaskState | None = None) -> tuple[NodeTask, ...]:
        """The stored node tasks (in ``state`` if given), oldest first."""
        return await self._call(lambda conn: task_rows.tasks(conn, state))

    async def set_task_state(self, job_uid: str, *, state: TaskState, current_action: str) -> NodeTask:
        """Move a node task on without a result (e.g. resumed after confirmation).

        Errors: :class:`TaskNotFoundError`."""
        return await self._call(lambda conn: task_rows.set_task_state(conn, job_uid, state, current_action))

    async def remove_task(self, job_uid: str) -> bool:
        """Forget a node task with its progress and any exclusive hold it has; its reports stay in the outbox."""
        return await self._call(lambda conn: task_rows.remove_task(conn, job_uid))

    async def prune_finished(self, received_before: datetime) -> int:
        """Forget the finished tasks received before ``received_before``, with their progress; how many.

        A task whose reports still wait for a hub's acknowledgement, or that holds the node's
        exclusive slot, is kept: the first is still needed to answer the hub's RunAction again, the
        second to release the slot when the work it guards is proven.
        """
        return await self._call(lambda conn: task_rows.prune_finished(conn, received_before))

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
        return await self._call(lambda conn: task_rows.record_result(conn, progress, state, current_action, attempt))

    async def progress(self, job_uid: str) -> tuple[ActionProgress, ...]:
        """The recorded results of a node task's actions, in the order they were first recorded."""
        return await self._call(lambda conn: task_rows.progress(conn, job_uid))

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
        return await self._call(lambda conn: outbox_rows.insert_report(conn, draft))

    async def pending(self, *, after: int = 0, limit: int | None = None) -> tuple[OutboxReport, ...]:
        """The unacknowledged reports with a seq above ``after``, in seq order (at most ``limit``)."""
        return await self._call(lambda conn: outbox_rows.pending(conn, after, limit))

    async def used_bytes(self) -> int:
        """Bytes of the store's file in use, free pages not counted: what ``storeQuotaBytes`` is measured against."""
        return await self._call(count_rows.used_bytes)

    async def counts(self) -> StoreCounts:
        """Tasks by state, reports waiting and dropped, bytes in use: counted in one read, no row decoded."""
        return await self._call(count_rows.counts)

    async def outbox_depth(self) -> int:
        """How many reports wait for a hub's acknowledgement."""
        return await self._call(outbox_rows.depth)

    async def acknowledge(self, seq: int) -> bool:
        """Forget a report a hub has durably applied; False if it was not pending (a repeated ack). The last
        report of a finished task takes the task's spec with it."""
        return await self._call(lambda conn: outbox_rows.acknowledge(conn, seq))

    async def drop(self, seq: int, reason: str) -> bool:
        """Give up on a report a hub refused for good; it moves to the dropped reports. False if not pending."""
        dropped_at = stamp(self._now())
        return await self._call(lambda conn: outbox_rows.drop(conn, seq, reason, dropped_at))

    async def dropped(self) -> tuple[DroppedReport, ...]:
        """The most recently dropped reports, in seq order."""
        return await self._call(outbox_rows.dropped)

    # ------------------------------------------------------------------------ exclusive operation

    async def try_begin_exclusive(self, job_uid: str, kind: str) -> str | None:
        """Take the node's one upgrade-or-config-update slot for a stored task: None when taken (or already
        held by this task, as after a restart), else the holder's description. Errors: :class:`TaskNotFoundError`."""
        since = stamp(self._now())
        return await self._call(lambda conn: hold_rows.begin(conn, job_uid, kind, since))

    async def end_exclusive(self, job_uid: str) -> bool:
        """Release the slot if this task holds it; False otherwise."""
        return await self._call(lambda conn: hold_rows.end(conn, job_uid))

    async def exclusive_hold(self) -> ExclusiveHold | None:
        """Who holds the slot, if anyone."""
        return await self._call(hold_rows.hold)

    # -------------------------------------------------------------------------------------- cache

    async def cache_upsert(self, kind: str, rows: tuple[Row, ...]) -> tuple[Written | Kept, ...]:
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
        updated_at = stamp(self._now())
        await self._call(lambda conn: fact_rows.put(conn, key, encoded, updated_at))

    async def get_fact(self, key: str, type_: type[T]) -> T | None:
        """The fact under ``key`` decoded as ``type_``, or None. Errors: :class:`StoreError` if it is not one."""
        value = await self._call(lambda conn: fact_rows.get(conn, key))
        if value is None:
            return None
        try:
            return msgspec.json.decode(value, type=type_)
        except msgspec.DecodeError as exc:
            raise StoreError(self.path, StoreFault.SCHEMA, f"fact {key!r}: {exc}") from exc

    async def delete_fact(self, key: str) -> bool:
        """Forget a fact; False if there was none."""
        return await self._call(lambda conn: fact_rows.delete(conn, key))


@contextlib.asynccontextmanager
async def open_store(
    path: str | os.PathLike[str],
    *,
    now: Callable[[], datetime] = utc_now,
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
    now: Callable[[], datetime] = utc_now,
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
