"""The outbox's tables in the edge store: the reports waiting for a hub's acknowledgement, and those given up on.

Plain functions over an open connection, run by :class:`roles.edge.store.store.EdgeStore` in its worker
thread. A report's ``seq`` is never reused by the store file; the last report of a finished task takes
the task's spec with it (:func:`report_left`).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Final

import msgspec

from roles.edge.store.records import NO_SPEC, DroppedReport, OutboxReport, TaskState, time_of
from roles.edge.store.schema import transaction

__all__ = ["DROPPED_KEPT", "acknowledge", "depth", "drop", "dropped", "insert_report", "pending", "report_left"]

DROPPED_KEPT: Final = 1000
"""How many dropped reports are kept for inspection; older ones are pruned as new ones arrive."""
_REPORT_COLUMNS: Final = "seq, route, job_uid, action, succ, finish_time, reason, extend, attempt"
_REPORT_FIELDS: Final = len(_REPORT_COLUMNS.split(","))


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


def insert_report(conn: sqlite3.Connection, report: OutboxReport) -> OutboxReport:
    """Queue ``report``; returns it with the seq it was given."""
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


def report_left(conn: sqlite3.Connection, seq: int) -> None:
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
            (NO_SPEC, row[0], str(TaskState.FINISHED), NO_SPEC, row[0]),
        )


def pending(conn: sqlite3.Connection, after: int, limit: int | None) -> tuple[OutboxReport, ...]:
    """The unacknowledged reports with a seq above ``after``, in seq order (at most ``limit``)."""
    rows = conn.execute(
        f"SELECT {_REPORT_COLUMNS} FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?",
        (after, -1 if limit is None else limit),
    )
    return tuple(_report(row) for row in rows)


def depth(conn: sqlite3.Connection) -> int:
    """How many reports wait for a hub's acknowledgement."""
    return int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])


def acknowledge(conn: sqlite3.Connection, seq: int) -> bool:
    """Forget report ``seq`` in one transaction; False if it was not pending."""
    with transaction(conn):
        was_pending = conn.execute("SELECT 1 FROM outbox WHERE seq = ?", (seq,)).fetchone() is not None
        report_left(conn, seq)
    return was_pending


def drop(conn: sqlite3.Connection, seq: int, reason: str, dropped_at: str) -> bool:
    """Move report ``seq`` to the dropped reports in one transaction, keeping the newest
    :data:`DROPPED_KEPT`; False if it was not pending."""
    with transaction(conn):
        moved = conn.execute(
            f"INSERT INTO dropped_reports ({_REPORT_COLUMNS}, drop_reason, dropped_at)"
            f" SELECT {_REPORT_COLUMNS}, ?, ? FROM outbox WHERE seq = ?",
            (reason, dropped_at, seq),
        ).rowcount
        report_left(conn, seq)
        conn.execute(
            "DELETE FROM dropped_reports WHERE seq NOT IN (SELECT seq FROM dropped_reports ORDER BY seq DESC LIMIT ?)",
            (DROPPED_KEPT,),
        )
    return moved == 1


def dropped(conn: sqlite3.Connection) -> tuple[DroppedReport, ...]:
    """The most recently dropped reports, in seq order."""
    rows = conn.execute(f"SELECT {_REPORT_COLUMNS}, drop_reason, dropped_at FROM dropped_reports ORDER BY seq")
    return tuple(
        DroppedReport(
            report=_report(row[:_REPORT_FIELDS]),
            reason=row[_REPORT_FIELDS],
            dropped_at=time_of(row[_REPORT_FIELDS + 1]),
        )
        for row in rows
    )
