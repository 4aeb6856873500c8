"""The edge store's file: opening it, its schema and numbered migrations, and the errors SQLite's become.

Schema changes are numbered migrations (``PRAGMA user_version``). Each records the oldest schema
version whose code can still use the file: additive migrations keep it, so an agent rolled back
after an upgrade still opens the store the newer agent wrote. Only SQL available since SQLite 3.24
is used (no STRICT tables, no RETURNING), because agents link the device's own libsqlite3.

The operations on the open file are :mod:`roles.edge.store.store`'s.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Final

import msgspec

__all__ = ["SCHEMA_VERSION", "StoreError", "StoreFault", "connect", "store_error", "transaction"]

_BUSY_TIMEOUT_S: Final = 5.0


# ------------------------------------------------------------------------------------------- errors


class StoreFault(StrEnum):
    """What kind of failure a :class:`StoreError` is, so the role can react (e.g. quarantine a corrupt file)."""

    FULL = "full"
    READ_ONLY = "read_only"
    CANNOT_OPEN = "cannot_open"
    CORRUPT = "corrupt"
    BUSY = "busy"
    IO = "io"
    SCHEMA = "schema"
    OTHER = "other"


_FAULT_TEXT: Final = {
    StoreFault.FULL: "is full",
    StoreFault.READ_ONLY: "is read-only",
    StoreFault.CANNOT_OPEN: "cannot be opened",
    StoreFault.CORRUPT: "is corrupt or not a database",
    StoreFault.BUSY: "is locked by another process",
    StoreFault.IO: "had an I/O error",
    StoreFault.SCHEMA: "has an unusable schema",
    StoreFault.OTHER: "failed",
}

# Primary result codes (https://sqlite.org/rescode.html); Python reports extended codes, whose low byte is these.
_FAULT_BY_CODE: Final = {
    3: StoreFault.CANNOT_OPEN,  # SQLITE_PERM
    5: StoreFault.BUSY,  # SQLITE_BUSY
    6: StoreFault.BUSY,  # SQLITE_LOCKED
    8: StoreFault.READ_ONLY,  # SQLITE_READONLY
    10: StoreFault.IO,  # SQLITE_IOERR
    11: StoreFault.CORRUPT,  # SQLITE_CORRUPT
    13: StoreFault.FULL,  # SQLITE_FULL
    14: StoreFault.CANNOT_OPEN,  # SQLITE_CANTOPEN
    26: StoreFault.CORRUPT,  # SQLITE_NOTADB
}


class StoreError(Exception):
    """The store could not do what was asked; the message names the file and the cause."""

    def __init__(self, path: Path, fault: StoreFault, cause: str) -> None:
        super().__init__(f"edge store {path} {_FAULT_TEXT[fault]}: {cause}")
        self.path = path
        self.fault = fault
        self.cause = cause


def store_error(path: Path, exc: sqlite3.Error | OSError) -> StoreError:
    """``exc`` as the :class:`StoreError` it means, with its fault read from SQLite's result code."""
    if isinstance(exc, OSError):
        return StoreError(path, StoreFault.CANNOT_OPEN, str(exc))
    code = getattr(exc, "sqlite_errorcode", None)
    fault = _FAULT_BY_CODE.get(code & 0xFF, StoreFault.OTHER) if isinstance(code, int) else StoreFault.OTHER
    return StoreError(path, fault, str(exc))


# ---------------------------------------------------------------------------------------- migrations


class _Migration(msgspec.Struct, frozen=True):
    version: int
    oldest_reader: int
    """The oldest schema version whose code can still use a store at ``version``."""
    statements: tuple[str, ...]


_MIGRATIONS: Final = (
    _Migration(
        version=1,
        oldest_reader=1,
        statements=(
            "CREATE TABLE store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            """CREATE TABLE node_tasks (
                job_uid TEXT PRIMARY KEY, route TEXT NOT NULL, job_type TEXT NOT NULL, spec BLOB NOT NULL,
                run_action_id TEXT NOT NULL, received_at TEXT NOT NULL, state TEXT NOT NULL,
                current_action TEXT NOT NULL)""",
            """CREATE TABLE action_progress (
                job_uid TEXT NOT NULL REFERENCES node_tasks (job_uid) ON DELETE CASCADE,
                action TEXT NOT NULL, succ INTEGER NOT NULL, finish_time TEXT NOT NULL, reason TEXT NOT NULL,
                extend TEXT NOT NULL, PRIMARY KEY (job_uid, action))""",
            # AUTOINCREMENT, unlike a plain rowid, never hands out a value again, even after the
            # highest row is deleted: a hub may still hold an acknowledgement for that seq.
            """CREATE TABLE outbox (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT NOT NULL, job_uid TEXT NOT NULL,
                action TEXT NOT NULL, succ INTEGER NOT NULL, finish_time TEXT NOT NULL, reason TEXT NOT NULL,
                extend TEXT NOT NULL)""",
            """CREATE TABLE dropped_reports (
                seq INTEGER PRIMARY KEY, route TEXT NOT NULL, job_uid TEXT NOT NULL, action TEXT NOT NULL,
                succ INTEGER NOT NULL, finish_time TEXT NOT NULL, reason TEXT NOT NULL, extend TEXT NOT NULL,
                drop_reason TEXT NOT NULL, dropped_at TEXT NOT NULL)""",
            # One row at most; deleting its task releases it, so a forgotten task never blocks the node.
            """CREATE TABLE exclusive_hold (
                slot TEXT PRIMARY KEY CHECK (slot = 'node'),
                job_uid TEXT NOT NULL REFERENCES node_tasks (job_uid) ON DELETE CASCADE,
                kind TEXT NOT NULL, since TEXT NOT NULL)""",
            "CREATE TABLE agent_facts (key TEXT PRIMARY KEY, value BLOB NOT NULL, updated_at TEXT NOT NULL)",
        ),
    ),
    # The cache of the node's cloud objects (roles.edge.store.cache_rows). Additive: an agent from before
    # it ignores the tables, so a rollback still opens the store.
    _Migration(
        version=2,
        oldest_reader=1,
        statements=(
            """CREATE TABLE cache_objects (
                kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
                resource_version INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (kind, namespace, name))""",
            # Each kind's resource version: the newest a change to it or a listing of it carried.
            "CREATE TABLE cache_kinds (kind TEXT PRIMARY KEY, resource_version INTEGER NOT NULL)",
        ),
    ),
    # Retries: a task is its job UID and attempt. One row per job UID still (an attempt replaces the
    # one before it), so the keys stay and an agent of version 1, rolled back onto this file, reads
    # and writes it as before: its tasks are attempt 1, and its reports, stored with attempt 0 ("not
    # said"), apply to the node's current attempt, as they always did.
    _Migration(
        version=3,
        oldest_reader=1,
        statements=(
            "ALTER TABLE node_tasks ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1",
            "ALTER TABLE outbox ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE dropped_reports ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0",
        ),
    ),
    # The parts of a replace sent in chunks, staged until its last one (roles.edge.store.cache_rows). Additive:
    # an agent from before it ignores the table.
    _Migration(
        version=4,
        oldest_reader=1,
        statements=(
            """CREATE TABLE cache_staging (
                kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
                resource_version INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (kind, namespace, name))""",
        ),
    ),
)

SCHEMA_VERSION: Final = _MIGRATIONS[-1].version


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: committed when the block ends, rolled back if it raises."""
    # IMMEDIATE takes the write lock up front, so a concurrent reader process (an inspection tool)
    # makes us wait for the busy timeout instead of failing half-way through.
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        # SQLite rolls back by itself on some errors (SQLITE_FULL among them); a second ROLLBACK would fail.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _oldest_reader(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM store_meta WHERE key = 'oldest_reader'").fetchone()
    return int(row[0]) if row else 0


def _migrate_step(conn: sqlite3.Connection, migration: _Migration) -> None:
    """Apply one migration, and record it, in one transaction."""
    with transaction(conn):
        for statement in migration.statements:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO store_meta (key, value) VALUES ('oldest_reader', ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(migration.oldest_reader),),
        )
        conn.execute(f"PRAGMA user_version = {int(migration.version)}")


def _migrate(conn: sqlite3.Connection, path: Path) -> int:
    """Bring the schema up to :data:`SCHEMA_VERSION`; returns the version found."""
    found: int = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        oldest = _oldest_reader(conn)
        if oldest > SCHEMA_VERSION:
            raise StoreError(
                path,
                StoreFault.SCHEMA,
                f"schema version {found} needs an agent that reads version {oldest} or later;"
                f" this agent reads up to {SCHEMA_VERSION}",
            )
        return found
    for migration in _MIGRATIONS:
        if migration.version > found:
            _migrate_step(conn, migration)
    return found


def connect(path: Path, max_bytes: int | None) -> tuple[sqlite3.Connection, int]:
    """Open (creating if need be), configure, check and migrate; returns the connection and the version found."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    try:
        # The store holds job specs (config values) and may hold the node's Secrets: the agent's only,
        # however the file came to be. SQLite creates -wal and -shm with the main file's mode.
        for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if file == path or file.exists():
                file.chmod(0o600)
        # Reading the header here is what finds a file that is not a database.
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(path, StoreFault.CANNOT_OPEN, f"write-ahead logging unavailable (journal mode {mode})")
        # FULL, not NORMAL: in WAL mode NORMAL keeps the file consistent but a commit can vanish on power
        # loss. We acknowledge a RunAction once stored, and the outbox's seq must never go back (a hub may
        # hold an acknowledgement for it), so a commit must be on disk before we act on it. Writes are a
        # few per action, so one fsync each costs nothing that matters.
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
        if max_bytes is not None:
            page_size: int = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {max(1, max_bytes // page_size)}")
        # A damaged page would otherwise surface in the middle of a task; the store is small (reports
        # leave once acknowledged), so checking it once per start is cheap.
        problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise StoreError(path, StoreFault.CORRUPT, "; ".join(str(p) for p in problems[:3]))
        found = _migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn, found
