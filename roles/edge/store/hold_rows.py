"""The exclusive hold's table in the edge store: the node task running this node's one upgrade or config update.

keadm's ``idempotency_record``, made durable and tied to its task (a row naming a stored task), so it
cannot outlive it. Plain functions over an open connection, run by
:class:`roles.edge.store.store.EdgeStore` in its worker thread.
"""

from __future__ import annotations

import sqlite3

from roles.edge.store.records import ExclusiveHold, time_of
from roles.edge.store.schema import transaction
from roles.edge.store.task_rows import require_task

__all__ = ["begin", "end", "hold"]


def hold(conn: sqlite3.Connection) -> ExclusiveHold | None:
    """Who holds the slot, if anyone."""
    row = conn.execute(
        "SELECT h.job_uid, t.route, h.kind, h.since FROM exclusive_hold h JOIN node_tasks t USING (job_uid)"
    ).fetchone()
    if row is None:
        return None
    return ExclusiveHold(job_uid=row[0], route=row[1], kind=row[2], since=time_of(row[3]))


def begin(conn: sqlite3.Connection, job_uid: str, kind: str, since: str) -> str | None:
    """Take the slot for stored task ``job_uid`` in one transaction: None when taken (or already held by
    this task), else the holder's description. Errors: :class:`~roles.edge.store.records.TaskNotFoundError`."""
    with transaction(conn):
        require_task(conn, job_uid)
        holder = hold(conn)
        if holder is not None:
            return None if holder.job_uid == job_uid else holder.describe()
        conn.execute(
            "INSERT INTO exclusive_hold (slot, job_uid, kind, since) VALUES ('node', ?, ?, ?)",
            (job_uid, kind, since),
        )
        return None


def end(conn: sqlite3.Connection, job_uid: str) -> bool:
    """Release the slot if task ``job_uid`` holds it; False otherwise."""
    return conn.execute("DELETE FROM exclusive_hold WHERE job_uid = ?", (job_uid,)).rowcount == 1
