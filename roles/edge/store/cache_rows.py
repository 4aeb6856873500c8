"""The cache's tables in the edge store: one row per cached cloud object, and each kind's resource version.

Plain functions over an open connection, run by :class:`roles.edge.store.store.EdgeStore` in its worker
thread; each write is one transaction, so a failed one (a full disk) changes nothing. The rules are
:class:`roles.edge.cache.view.MemoryCache`'s: an older resource version never overwrites a newer
one, and a deletion older than the cached object is ignored. Bodies are the JSON the API server
sent, stored as received.

A replace sent in chunks (:mod:`nodetask.cache_chunks`) is staged apart, in ``cache_staging``, one
chunk per transaction, and only its last chunk swaps the collection (:func:`replace_staged`), in
one transaction with the staged rows: until then the cached collection is untouched. A kind has at
most one staged replace: its first chunk takes the place of whatever was staged, and any replace of
the kind ends what was staged.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence

import msgspec

from roles.edge.store.schema import transaction

__all__ = [
    "Deletion",
    "Kept",
    "Key",
    "Replacement",
    "Row",
    "Written",
    "delete",
    "get",
    "keys",
    "listing",
    "purge",
    "replace",
    "replace_staged",
    "stage",
    "staged_keys",
    "unstage",
    "upsert",
]


Key = tuple[str, str]
"""An object's ``(namespace, name)`` within its kind."""


class Row(msgspec.Struct, frozen=True):
    """One cached object: where it is, its resource version and its JSON."""

    namespace: str
    name: str
    resource_version: int
    body: bytes


class Written(msgspec.Struct, frozen=True):
    """An upsert that changed the cache, and the body it replaced (None: the object is new)."""

    row: Row
    previous: bytes | None


class Kept(msgspec.Struct, frozen=True):
    """An upsert that changed nothing: the cache holds this very object, or (``stale``) a newer version."""

    stale: bool


class Deletion(msgspec.Struct, frozen=True):
    """What a deletion did: ``removed`` is the last body of the object taken out (None when nothing was),
    ``stale`` whether it was ignored because the cache holds a newer version, ``version`` the version
    the deletion happened at (for the DELETED event)."""

    removed: bytes | None
    stale: bool
    version: int


class Replacement(msgspec.Struct, frozen=True):
    """What replacing a kind's collection did: the objects taken out (their last bodies), the upserts,
    and the kind's resource version after it."""

    removed: tuple[bytes, ...]
    written: tuple[Written, ...]
    version: int


def _kind_version(conn: sqlite3.Connection, kind: str) -> int:
    row = conn.execute("SELECT resource_version FROM cache_kinds WHERE kind = ?", (kind,)).fetchone()
    return int(row[0]) if row else 0


def _advance(conn: sqlite3.Connection, kind: str, version: int) -> None:
    conn.execute(
        "INSERT INTO cache_kinds (kind, resource_version) VALUES (?, ?) ON CONFLICT (kind)"
        " DO UPDATE SET resource_version = max(resource_version, excluded.resource_version)",
        (kind, version),
    )


def _current(conn: sqlite3.Connection, kind: str, namespace: str, name: str) -> tuple[int, bytes] | None:
    row = conn.execute(
        "SELECT resource_version, body FROM cache_objects WHERE kind = ? AND namespace = ? AND name = ?",
        (kind, namespace, name),
    ).fetchone()
    return None if row is None else (int(row[0]), bytes(row[1]))


def _put(conn: sqlite3.Connection, kind: str, row: Row) -> None:
    conn.execute(
        "INSERT INTO cache_objects (kind, namespace, name, resource_version, body) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (kind, namespace, name) DO UPDATE SET resource_version = excluded.resource_version,"
        " body = excluded.body",
        (kind, row.namespace, row.name, row.resource_version, row.body),
    )


def _upsert_one(conn: sqlite3.Connection, kind: str, row: Row) -> Written | Kept:
    current = _current(conn, kind, row.namespace, row.name)
    # As a replace does: an older version, or the very object cached, changes nothing (a kubelet gets its
    # Node every ten seconds, and each answer is fed to the cache).
    if current is not None and current[0] > row.resource_version:
        return Kept(stale=True)
    if current is not None and current[1] == row.body:
        return Kept(stale=False)
    _put(conn, kind, row)
    _advance(conn, kind, row.resource_version)
    return Written(row, None if current is None else current[1])


def upsert(conn: sqlite3.Connection, kind: str, rows: Sequence[Row]) -> tuple[Written | Kept, ...]:
    """Add or update ``rows`` in one transaction; for each, what it changed or why it changed nothing."""
    with transaction(conn):
        return tuple(_upsert_one(conn, kind, row) for row in rows)


def delete(conn: sqlite3.Connection, kind: str, namespace: str, name: str, version: int | None) -> Deletion:
    """Remove an object deleted at ``version`` unless the cache holds a newer version of it.

    ``version`` None deletes whatever is cached (the hub knew no version); the DELETED event then
    carries the kind's version plus one, newer than any listing a watch started from, without
    moving the kind's version (a real change may still come at that number).
    """
    with transaction(conn):
        current = _current(conn, kind, namespace, name)
        kind_version = _kind_version(conn, kind)
        at = kind_version + 1 if version is None else version
        if current is None:
            return Deletion(removed=None, stale=False, version=at)
        if version is not None and current[0] > version:
            return Deletion(removed=None, stale=True, version=at)
        conn.execute("DELETE FROM cache_objects WHERE kind = ? AND namespace = ? AND name = ?", (kind, namespace, name))
        if version is not None:
            _advance(conn, kind, version)
        return Deletion(removed=current[1], stale=False, version=at)


def replace(
    conn: sqlite3.Connection, kind: str, rows: Sequence[Row], version: int | None, keep: Collection[Key] = ()
) -> Replacement:
    """Make ``rows`` the collection of ``kind`` as listed at ``version``, in one transaction.

    As everywhere, a listed object older than the cached one does not overwrite it. An object not
    listed is removed, unless the cache holds it at a newer version than ``version`` (the list,
    perhaps from a lagging cache, says nothing about it) or it is in ``keep`` (listed, but not
    sent); without a ``version`` every other one is. Whatever was staged for ``kind`` is dropped.
    """
    with transaction(conn):
        return _replace(conn, kind, rows, version, keep)


def _replace(
    conn: sqlite3.Connection, kind: str, rows: Sequence[Row], version: int | None, keep: Collection[Key]
) -> Replacement:
    old = {
        (ns, name): (int(rv), bytes(body))
        for ns, name, rv, body in conn.execute(
            "SELECT namespace, name, resource_version, body FROM cache_objects WHERE kind = ?", (kind,)
        )
    }
    fresh = {(row.namespace, row.name): row for row in rows}
    newest = max((row.resource_version for row in rows), default=0)
    at = max(version if version is not None else 0, newest, _kind_version(conn, kind))
    removed: list[bytes] = []
    for key, (rv, body) in old.items():
        if key in fresh or key in keep or (version is not None and rv > version):
            continue
        conn.execute("DELETE FROM cache_objects WHERE kind = ? AND namespace = ? AND name = ?", (kind, *key))
        removed.append(body)
    written: list[Written] = []
    for key, row in fresh.items():
        before = old.get(key)
        if before is not None and (before[0] > row.resource_version or before[1] == row.body):
            continue
        _put(conn, kind, row)
        written.append(Written(row, None if before is None else before[1]))
    _advance(conn, kind, at)
    conn.execute("DELETE FROM cache_staging WHERE kind = ?", (kind,))
    return Replacement(removed=tuple(removed), written=tuple(written), version=at)


def stage(conn: sqlite3.Connection, kind: str, rows: Sequence[Row], *, first: bool) -> None:
    """Stage ``rows``, a chunk of a replace of ``kind``, in one transaction: after those staged before
    it, or, when it is the ``first`` chunk, in their place."""
    with transaction(conn):
        if first:
            conn.execute("DELETE FROM cache_staging WHERE kind = ?", (kind,))
        conn.executemany(
            "INSERT OR REPLACE INTO cache_staging (kind, namespace, name, resource_version, body)"
            " VALUES (?, ?, ?, ?, ?)",
            [(kind, row.namespace, row.name, row.resource_version, row.body) for row in rows],
        )


def _staged(conn: sqlite3.Connection, kind: str) -> list[Row]:
    return [
        Row(ns, name, int(rv), bytes(body))
        for ns, name, rv, body in conn.execute(
            "SELECT namespace, name, resource_version, body FROM cache_staging WHERE kind = ?", (kind,)
        )
    ]


def replace_staged(
    conn: sqlite3.Connection,
    kind: str,
    rows: Sequence[Row],
    version: int | None,
    keep: Collection[Key] = (),
    *,
    first: bool = False,
) -> Replacement:
    """:func:`replace` with the rows staged for ``kind`` followed by ``rows`` (the last chunk's), in one
    transaction; only ``rows`` when that chunk is also the ``first`` (what is staged is another replace's)."""
    with transaction(conn):
        staged = [] if first else _staged(conn, kind)
        return _replace(conn, kind, [*staged, *rows], version, keep)


def unstage(conn: sqlite3.Connection, kind: str | None = None) -> int:
    """Drop what was staged for ``kind`` (None: for every kind); how many rows there were."""
    with transaction(conn):
        if kind is None:
            return conn.execute("DELETE FROM cache_staging").rowcount
        return conn.execute("DELETE FROM cache_staging WHERE kind = ?", (kind,)).rowcount


def staged_keys(conn: sqlite3.Connection, kind: str) -> tuple[Key, ...]:
    """``(namespace, name)`` of every row staged for ``kind``."""
    return tuple(
        (ns, name)
        for ns, name in conn.execute("SELECT namespace, name FROM cache_staging WHERE kind = ? ORDER BY 1, 2", (kind,))
    )


def purge(conn: sqlite3.Connection, kind: str) -> int:
    """Forget every cached object of ``kind`` (and its version); how many there were."""
    with transaction(conn):
        count = conn.execute("DELETE FROM cache_objects WHERE kind = ?", (kind,)).rowcount
        conn.execute("DELETE FROM cache_kinds WHERE kind = ?", (kind,))
        return count


def get(conn: sqlite3.Connection, kind: str, namespace: str, name: str) -> bytes | None:
    """The cached body, or None."""
    current = _current(conn, kind, namespace, name)
    return None if current is None else current[1]


def listing(conn: sqlite3.Connection, kind: str, namespace: str) -> tuple[tuple[bytes, ...], int]:
    """The bodies of ``kind`` in ``namespace`` (``""``: all) by namespace and name, and the kind's version,
    read between the same two writes (the store makes one call at a time)."""
    where, args = ("AND namespace = ?", (kind, namespace)) if namespace else ("", (kind,))
    rows = conn.execute(f"SELECT body FROM cache_objects WHERE kind = ? {where} ORDER BY namespace, name", args)
    return tuple(bytes(body) for (body,) in rows), _kind_version(conn, kind)


def keys(conn: sqlite3.Connection, kind: str) -> tuple[tuple[str, str], ...]:
    """``(namespace, name)`` of every cached object of ``kind``."""
    return tuple(
        (ns, name)
        for ns, name in conn.execute("SELECT namespace, name FROM cache_objects WHERE kind = ? ORDER BY 1, 2", (kind,))
    )
