"""The durable cache taking a replace in chunks, with its real store: staged apart, swapped in by the last
chunk in one transaction, and never half done."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import structlog
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nodetask import cache_chunks
from nodetask.messages import CacheChunk, CacheKey
from roles.edge.cache.durable_cache import DurableCache
from roles.edge.cache.view import Object
from roles.edge.store.store import EdgeStore
from tests.unit.roles.edge.cache.world import (
    PAGE,
    full,
    key,
    mirror,
    obj,
    opened,
    raw,
    relist,
    upsert,
    versions,
)

KIND = "ConfigMap"
LIMIT = 600
"""A frame limit holding one of the objects below per chunk."""


def key_of(body: msgspec.Raw) -> CacheKey:
    meta = msgspec.json.decode(body)["metadata"]
    return CacheKey(kind=KIND, namespace=meta["namespace"], name=meta["name"])


def chunks(replace: str, version: int, *objects: Object, limit: int = LIMIT) -> tuple[CacheChunk, ...]:
    """The chunks of a replace of the ConfigMaps ``objects``, listed at ``version``."""
    return cache_chunks.split(
        KIND, raw(*objects), replace=replace, resource_version=str(version), limit=limit, key_of=key_of
    )


def sized(name: str, rv: int) -> Object:
    """An object whose frame alone is most of :data:`LIMIT`."""
    return obj(name, rv, data="x" * 300)


def store_of(cache: DurableCache) -> EdgeStore:
    store: EdgeStore = cache._store  # the same store, read as the agent's inspection would
    return store


async def test_a_replace_in_chunks_swaps_the_collection_only_with_its_last_chunk(tmp_path: Path) -> None:
    """Until the last chunk the cache serves the old collection; the last one swaps it in one step (the
    object not listed deleted, the others written), announces the changes, and leaves nothing staged."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert(KIND, obj("a", 5), obj("gone", 6)))
        parts = chunks("1", 20, sized("a", 9), sized("b", 9), sized("c", 9))
        assert len(parts) == 3
        with cache.subscribe(KIND) as changes:
            for part in parts[:-1]:
                assert not await cache.apply_chunk(part)
                assert await versions(cache) == {"a": 5, "gone": 6}
            assert await store_of(cache).cache_staged_keys(KIND) == (("ns", "a"), ("ns", "b"))
            assert await cache.apply_chunk(parts[-1])
            seen = {"a": 5, "gone": 6}
            mirror(changes, seen)
        assert await versions(cache) == seen == {"a": 9, "b": 9, "c": 9}
        assert (await cache.list(KIND, "")).resource_version == "20"
        assert await store_of(cache).cache_staged_keys(KIND) == ()
        assert cache.ledger.errors == {}


async def test_a_replace_cut_short_by_the_session_or_a_restart_leaves_the_collection_as_it_was(
    tmp_path: Path,
) -> None:
    """Chunks staged when the session ends are dropped as the next one starts, and those staged before a
    restart as the cache opens: the collection is the old one, and the rest of the replace cannot finish it."""
    parts = chunks("1", 20, sized("a", 9), sized("b", 9), sized("c", 9))
    async with opened(tmp_path) as cache:
        await cache.apply(upsert(KIND, obj("a", 5), obj("gone", 6)))
        await cache.apply_chunk(parts[0])
        await cache.apply_chunk(parts[1])
        await cache.drop_staging()  # a new session
        assert await store_of(cache).cache_staged_keys(KIND) == ()
        assert not await cache.apply_chunk(parts[2])
        assert await versions(cache) == {"a": 5, "gone": 6}
        await cache.apply_chunk(parts[0])
    async with opened(tmp_path) as cache:
        assert await store_of(cache).cache_staged_keys(KIND) == ()
        assert not await cache.apply_chunk(parts[1])
        assert not await cache.apply_chunk(parts[2])
        assert await versions(cache) == {"a": 5, "gone": 6}


async def test_a_chunk_missing_repeated_or_out_of_order_gives_the_replace_up(tmp_path: Path) -> None:
    """A chunk that does not follow the one before drops what was staged, and the last chunk then swaps
    nothing in; a warning says which chunk came and which was expected."""
    parts = chunks("1", 20, sized("a", 9), sized("b", 9), sized("c", 9))
    for order in ([0, 2], [0, 0, 1, 2], [1, 0, 2], [0, 1, 1, 2]):
        home = tmp_path / "".join(map(str, order))
        home.mkdir()
        async with opened(home) as cache:
            await cache.apply(upsert(KIND, obj("gone", 6)))
            with structlog.testing.capture_logs() as logs:
                done = [await cache.apply_chunk(parts[i]) for i in order]
            assert done == [False] * len(order), order
            assert await versions(cache) == {"gone": 6}, order
            assert await store_of(cache).cache_staged_keys(KIND) == (), order
            (warning,) = [entry for entry in logs if entry["event"] == "cache_chunk_out_of_place"]
            assert warning["log_level"] == "warning"


async def test_a_new_replace_takes_the_place_of_one_cut_short(tmp_path: Path) -> None:
    """The first chunk of another replace (the hub started over) drops what the earlier one staged."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert(KIND, obj("gone", 6)))
        old = chunks("1", 20, sized("a", 9), sized("b", 9), sized("c", 9))
        await cache.apply_chunk(old[0])
        await cache.apply_chunk(old[1])
        new = chunks("2", 30, sized("c", 25), sized("d", 25))
        assert [await cache.apply_chunk(part) for part in new] == [False, True]
        assert await versions(cache) == {"c": 25, "d": 25}
        assert not await cache.apply_chunk(old[2])
        assert await versions(cache) == {"c": 25, "d": 25}


async def test_a_plain_replace_ends_a_replace_in_chunks_under_way(tmp_path: Path) -> None:
    """A whole collection in one frame is the newest list: what was staged is dropped with the swap, and
    the rest of the earlier replace in chunks changes nothing."""
    async with opened(tmp_path) as cache:
        old = chunks("1", 20, sized("a", 9), sized("b", 9))
        await cache.apply_chunk(old[0])
        assert await cache.apply(relist(KIND, 30, obj("z", 25)))
        assert await store_of(cache).cache_staged_keys(KIND) == ()
        assert not await cache.apply_chunk(old[1])
        assert await versions(cache) == {"z": 25}


async def test_an_object_too_large_to_send_stays_as_cached(tmp_path: Path) -> None:
    """An object the hub could not fit in any frame is named as kept: the edge keeps its copy of it, and
    the rest of the collection is swapped in around it."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert(KIND, obj("huge", 5), obj("gone", 6)))
        parts = chunks("1", 20, sized("a", 9), obj("huge", 9, data="y" * 2000), sized("b", 9))
        assert [k.name for part in parts for k in part.kept] == ["huge"]
        assert [await cache.apply_chunk(part) for part in parts][-1]
        assert await versions(cache) == {"a": 9, "b": 9, "huge": 5}


async def test_chunks_from_other_kinds_are_staged_apart(tmp_path: Path) -> None:
    """Two kinds' replaces in chunks interleaved each swap their own collection."""
    async with opened(tmp_path) as cache:
        maps = chunks("1", 20, sized("a", 9), sized("b", 9))
        pods = cache_chunks.split(
            "Pod", raw(sized("p", 9), sized("q", 9)), replace="1", resource_version="20", limit=LIMIT, key_of=key_of
        )
        assert [await cache.apply_chunk(part) for part in (maps[0], pods[0], maps[1], pods[1])] == [
            False,
            False,
            True,
            True,
        ]
        assert await versions(cache) == {"a": 9, "b": 9}
        assert await versions(cache, "Pod") == {"p": 9, "q": 9}


async def test_a_chunk_that_cannot_be_staged_errs_every_key_the_replace_touches(tmp_path: Path) -> None:
    """On a full store a chunk that cannot be staged errs its keys and the cached ones, the later chunks
    err theirs, the last one ends the replace with the collection untouched; a later replace clears them."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert(KIND, obj("old", 5)))
    big = obj("a", 9, data="z" * 16 * PAGE)
    parts = chunks("1", 20, big, sized("b", 9), limit=len(raw(big)[0]) + 200)
    assert len(parts) == 2
    async with full(tmp_path) as cache:
        assert not await cache.apply_chunk(parts[0])
        assert set(cache.ledger.errors) == {key("old"), key("a")}
        assert cache.ledger.errors[key("a")].endswith("is full: database or disk is full")
        assert await cache.apply_chunk(parts[1])
        assert set(cache.ledger.errors) == {key("old"), key("a"), key("b")}
        assert await versions(cache) == {"old": 5}
    async with opened(tmp_path) as cache:
        assert [await cache.apply_chunk(part) for part in chunks("2", 30, sized("a", 9), sized("b", 9))][-1]
        assert cache.ledger.errors == {}
        assert await versions(cache) == {"a": 9, "b": 9}


# ------------------------------------------------------------------------------------------ the model

FIRST = chunks("1", 20, sized("a", 10), sized("b", 10), sized("c", 10))
SECOND = chunks("2", 20, obj("c", 10, data="w" * 300), sized("d", 11))
INITIAL = {"x": 5, "a": 5}

steps = st.lists(
    st.one_of(
        st.sampled_from(FIRST + SECOND).map(lambda part: ("chunk", part)),
        st.just(("session", None)),
        st.just(("reopen", None)),
    ),
    max_size=14,
)


def expected(program: list[tuple[str, Any]]) -> dict[str, int]:
    """The collection after ``program``: that of the last replace :func:`cache_chunks.reassemble` commits
    within a session (a new session, or a restart, forgets what was staged), or the first one if none is."""
    now = dict(INITIAL)
    for is_chunks, ops in itertools.groupby(program, lambda op: op[0] == "chunk"):
        if is_chunks:
            for done in cache_chunks.reassemble(part for _, part in ops):
                now = dict(_version(body) for body in done.objects)
    return now


def _version(body: msgspec.Raw) -> tuple[str, int]:
    meta = msgspec.json.decode(body)["metadata"]
    return meta["name"], int(meta["resourceVersion"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
@example([("chunk", FIRST[0]), ("session", None), ("chunk", FIRST[1]), ("chunk", FIRST[2])])
@example([("chunk", FIRST[0]), ("chunk", FIRST[1]), ("reopen", None), ("chunk", FIRST[2])])
def test_any_stream_of_chunks_sessions_and_restarts_leaves_what_reassembly_says(program: list[tuple[str, Any]]) -> None:
    """Chunks of two replaces in any order, with new sessions and restarts between them, leave the
    collection of the last replace reassembly commits (or the one before them all), never a mix; nothing
    stays staged once a session starts; subscribers applying the announced changes see the same."""

    async def main(home: Path) -> None:
        async with opened(home) as cache:
            await cache.apply(upsert(KIND, *(obj(name, rv) for name, rv in INITIAL.items())))
        done: list[tuple[str, Any]] = []
        for restart, ops in itertools.groupby(program, lambda op: op[0] == "reopen"):
            if restart:
                done.extend(ops)
                continue
            async with opened(home) as cache:
                assert await store_of(cache).cache_staged_keys(KIND) == ()
                seen = await versions(cache)
                assert seen == expected(done)
                with cache.subscribe(KIND) as changes:
                    for op, part in ops:
                        done.append((op, part))
                        if op == "chunk":
                            await cache.apply_chunk(part)
                        else:
                            await cache.drop_staging()
                            assert await store_of(cache).cache_staged_keys(KIND) == ()
                        mirror(changes, seen)
                        assert await versions(cache) == seen == expected(done)
                assert cache.ledger.errors == {}

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))
