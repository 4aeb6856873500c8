"""The agent facts' table in the edge store: a few values the agent keeps under a key (JSON, any msgspec type).

Plain functions over an open connection, run by :class:`roles.edge.store.store.EdgeStore` in its
worker thread, which encodes and decodes the values.
"""

from __future__ import annotations

import sqlite3

__all__ = ["delete", "get", "put"]


def put(conn: sqlite3.Connection, key: str, encoded: bytes, updated_at: str) -> None:
    """Store ``encoded`` under ``key``, replacing the old value."""
    conn.execute(
        "INSERT INTO agent_facts (key, value, updated_at) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE"
        " SET value = excluded.value, updated_at = excluded.updated_at",
        (key, encoded, updated_at),
    )


def get(conn: sqlite3.Connection, key: str) -> bytes | None:
    """The value stored under ``key``, or None."""
    row = conn.execute("SELECT value FROM agent_facts WHERE key = ?", (key,)).fetchone()
    if row is None:
        return None
    value: bytes = row[0]
    return value


def delete(conn: sqlite3.Connection, key: str) -> bool:
    """Forget the value under ``key``; False if there was none."""
    return conn.execute("DELETE FROM agent_facts WHERE key = ?", (key,)).rowcount == 1
