"""Counting what the edge store holds, without reading the rows: plain functions over an open connection, run by
:class:`roles.edge.store.store.EdgeStore` in its worker thread."""

from __future__ import annotations

import sqlite3

from roles.edge.store.records import StoreCounts

__all__ = ["counts", "used_bytes"]


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes of the store's file in use, free pages not counted."""
    pages: int = conn.execute("PRAGMA page_count").fetchone()[0]
    free: int = conn.execute("PRAGMA freelist_count").fetchone()[0]
    size: int = conn.execute("PRAGMA page_size").fetchone()[0]
    return (pages - free) * size


def counts(conn: sqlite3.Connection) -> StoreCounts:
    """Tasks by state, reports waiting and dropped, and the bytes in use, in one read."""
    tasks = dict(conn.execute("SELECT state, COUNT(*) FROM node_tasks GROUP BY state").fetchall())
    (depth,) = conn.execute("SELECT COUNT(*) FROM outbox").fetchone()
    (dropped,) = conn.execute("SELECT COUNT(*) FROM dropped_reports").fetchone()
    return StoreCounts(tasks=tasks, outbox_depth=int(depth), dropped=int(dropped), used_bytes=used_bytes(conn))
