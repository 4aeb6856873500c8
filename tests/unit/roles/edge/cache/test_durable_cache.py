"""The durable cache: the local API's view of the node's cloud objects in the edge store, and its error keys."""

from __future__ import annotations

import itertools
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodetask.messages import CacheDeleted
from roles.edge.cache.durable_cache import _decode, _key_fields
from roles.edge.cache.view import ChangeType, object_key, resource_version
from tests.unit.roles.edge.cache.world import PAGE, full, key, mirror, obj, opened, relist, upsert, versions

# ------------------------------------------------------------------------------------------ the model

names = st.sampled_from(["a", "b", "c", "d"])
versions_ = st.integers(1, 30)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), names, versions_),
        st.tuples(st.just("delete"), names, versions_),
        st.tuples(
            st.just("replace"),
            st.dictionaries(names, versions_, max_size=4),
            st.one_of(st.none(), versions_),
        ),
        st.tuples(st.just("reopen"), st.none(), st.none()),
    ),
    max_size=25,
)


def model_step(model: dict[str, int], op: str, arg: Any, version: Any) -> None:
    """The cache's rules, written plainly: what ``op`` leaves in ``model`` (name -> resource version)."""
    if op == "put":
        if model.get(arg, 0) <= version:
            model[arg] = version
    elif op == "delete":
        if arg in model and model[arg] <= version:
            del model[arg]
    elif op == "replace":
        kept = {n: v for n, v in model.items() if n not in arg and version is not None and v > version}
        listed = {n: max(v, model.get(n, 0)) for n, v in arg.items()}
        model.clear()
        model.update(kept | listed)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_any_sequence_of_writes_and_restarts_leaves_what_the_rules_say(program: list[tuple[str, Any, Any]]) -> None:
    """Upserts, deletions and relists in any order, across restarts, leave each object at the version a
    plain model of the rules says; subscribers who apply the announced changes see the same; the kind's
    resource version is never below an object's."""
    model: dict[str, int] = {}

    async def main(home: Path) -> None:
        for restart, steps in itertools.groupby(program, lambda op: op[0] == "reopen"):
            if restart:
                continue
            async with opened(home) as cache:
                seen = await versions(cache)
                assert seen == model
                with cache.subscribe("ConfigMap") as changes:
                    for op, arg, version in steps:
                        if op == "put":
                            assert await cache.apply(upsert("ConfigMap", obj(arg, version)))
                        elif op == "delete":
                            assert await cache.apply_deleted(CacheDeleted(key=key(arg), resource_version=str(version)))
                        else:
                            listed = [obj(n, v) for n, v in sorted(arg.items())]
                            assert await cache.apply(relist("ConfigMap", version, *listed))
                        model_step(model, op, arg, version)
                        mirror(changes, seen)
                        assert await versions(cache) == model
                        assert seen == model, "the announced changes add up to the cache"
                        listing = await cache.list("ConfigMap", "")
                        assert int(listing.resource_version) >= max(model.values(), default=0)
                assert cache.ledger.errors == {}

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


# ------------------------------------------------------------------------------------------- behaviour


async def test_get_and_list_serve_what_was_stored_by_namespace_and_name(tmp_path: Path) -> None:
    """Objects come back as the API server sent them; lists are sorted and filtered by namespace."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert("Pod", obj("b", 3, ns="x"), obj("a", 4, ns="y"), obj("c", 2, ns="x")))
        await cache.apply(upsert("Node", {"metadata": {"name": "edge-1", "resourceVersion": "9"}}))
        assert await cache.get("Pod", "x", "b") == obj("b", 3, ns="x")
        assert await cache.get("Pod", "y", "b") is None
        assert await cache.get("Node", "", "edge-1") == {"metadata": {"name": "edge-1", "resourceVersion": "9"}}
        listing = await cache.list("Pod", "x")
        assert [o["metadata"]["name"] for o in listing.items] == ["b", "c"]
        assert listing.resource_version == "4"
        everywhere = await cache.list("Pod", "")
        assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in everywhere.items] == [
            ("x", "b"),
            ("x", "c"),
            ("y", "a"),
        ]


async def test_a_deletion_announces_the_last_state_at_the_deletions_version(tmp_path: Path) -> None:
    """A DELETED change carries the object as it was, at the version it was deleted at (or newer than
    the kind's when the hub gave none), so that a watch started from the last listing sees it."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert("ConfigMap", obj("a", 5, data="last"), obj("b", 6)))
        with cache.subscribe("ConfigMap") as changes:
            assert await cache.apply_deleted(CacheDeleted(key=key("a"), resource_version="8"))
            assert await cache.apply_deleted(CacheDeleted(key=key("b")))
            first, second = changes.receive_nowait(), changes.receive_nowait()
        assert (first.type, first.object) == (ChangeType.DELETED, obj("a", 8, data="last"))
        assert (second.type, second.object["metadata"]["resourceVersion"]) == (ChangeType.DELETED, "9")
        assert await versions(cache) == {}
        assert (await cache.list("ConfigMap", "")).resource_version == "8"


async def test_a_relist_without_the_kind_keeps_the_collection(tmp_path: Path) -> None:
    """A kind the hub could not list gets no replace, and nothing else empties it: other kinds' relists
    leave it as it was."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert("ConfigMap", obj("a", 5)))
        await cache.apply(relist("Pod", 20, obj("p", 11)))
        assert await versions(cache) == {"a": 5}


async def test_secrets_are_refused_and_purged_unless_allowed(tmp_path: Path) -> None:
    """With Secrets allowed they are kept; opened without, the cached ones are purged, and new ones refused."""
    async with opened(tmp_path, keep_secrets=True) as cache:
        assert await cache.apply(upsert("Secret", obj("s", 3)))
        assert await versions(cache, "Secret") == {"s": 3}
    with structlog.testing.capture_logs() as logs:
        async with opened(tmp_path, keep_secrets=False) as cache:
            assert await versions(cache, "Secret") == {}
            assert not await cache.apply(upsert("Secret", obj("t", 4)))
            assert await versions(cache, "Secret") == {}
    events = [entry["event"] for entry in logs]
    assert "cache_secrets_purged" in events
    assert "cache_secrets_refused" in events


async def test_the_store_file_is_its_owners_only_even_if_it_was_not(tmp_path: Path) -> None:
    """The store, which may hold Secrets, is made 0600 at every open, whatever its mode was."""
    async with opened(tmp_path, keep_secrets=True) as cache:
        await cache.apply(upsert("Secret", obj("s", 3)))
    path = tmp_path / "store.sqlite"
    path.chmod(0o644)
    async with opened(tmp_path, keep_secrets=True):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        for extra in ("-wal", "-shm"):
            side = path.with_name(path.name + extra)
            assert not side.exists() or stat.S_IMODE(side.stat().st_mode) == 0o600


async def test_kinds_a_node_does_not_cache_are_refused(tmp_path: Path) -> None:
    """Only Node, Pod, ConfigMap and Secret are kept (Kubernetes' Node authorizer rule)."""
    async with opened(tmp_path, keep_secrets=True) as cache:
        assert not await cache.apply(upsert("ServiceAccount", obj("sa", 3)))
        assert await versions(cache, "ServiceAccount") == {}


async def test_an_object_that_cannot_be_stored_is_an_error_key_until_a_good_version_comes(tmp_path: Path) -> None:
    """An object without a numeric resource version errs its key (the rest of the message is stored);
    one without a name is only logged, having no key."""
    async with opened(tmp_path) as cache:
        bad = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "x1"}}
        nameless = {"metadata": {"resourceVersion": "3"}}
        with structlog.testing.capture_logs() as logs:
            assert not await cache.apply(upsert("ConfigMap", bad, nameless, obj("b", 2)))
        assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == ["cache_object_unreadable"]
        assert list(cache.ledger.errors) == [key("a")]
        assert "no numeric metadata.resourceVersion" in cache.ledger.errors[key("a")]
        assert await versions(cache) == {"b": 2}
        assert await cache.apply(upsert("ConfigMap", obj("a", 4)))
        assert cache.ledger.errors == {}


async def test_writes_that_fail_on_a_full_store_are_error_keys_until_rewritten(tmp_path: Path) -> None:
    """On a full store each failed write errs its keys with the store's reason; the errors survive a
    restart; a later successful write of a key clears it, and a stale write does not."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert("ConfigMap", obj("a", 5)))
    async with full(tmp_path) as cache:
        assert not await cache.apply(upsert("ConfigMap", obj("a", 9, data="y" * 4 * PAGE), obj("b", 9)))
        assert set(cache.ledger.errors) == {key("a"), key("b")}
        assert cache.ledger.errors[key("a")].endswith("is full: database or disk is full")
        assert cache.ledger.persisted
        assert (await cache.get("ConfigMap", "ns", "a")) == obj("a", 5), "the failed write changed nothing"
    async with opened(tmp_path) as cache:
        assert set(cache.ledger.errors) == {key("a"), key("b")}, "the ledger survives a restart"
        assert await cache.apply(upsert("ConfigMap", obj("b", 9)))
        assert await cache.apply(upsert("ConfigMap", obj("a", 4)))  # older than the cached 5: ignored
        assert set(cache.ledger.errors) == {key("a")}
        assert await cache.apply(upsert("ConfigMap", obj("a", 9)))
        assert cache.ledger.errors == {}


async def test_a_failed_relist_errs_the_listed_and_the_cached_keys(tmp_path: Path) -> None:
    """A replace that cannot be stored keeps the old collection and errs every key it would have
    touched; a later successful relist of that kind clears them all, and only that kind's."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert("ConfigMap", obj("old", 5)))
    async with full(tmp_path) as cache:
        assert not await cache.apply(relist("ConfigMap", 10, obj("new", 9, data="z" * 16 * PAGE)))
        assert not await cache.apply(upsert("Pod", obj("p", 5, data="z" * 16 * PAGE)))
        assert set(cache.ledger.errors) == {key("old"), key("new"), key("p", "Pod")}
        assert await versions(cache) == {"old": 5}
    async with opened(tmp_path) as cache:
        assert await cache.apply(relist("ConfigMap", 10, obj("new", 9)))
        assert set(cache.ledger.errors) == {key("p", "Pod")}
        assert await versions(cache) == {"new": 9}


async def test_the_ledger_is_not_in_the_store_and_survives_without_it(tmp_path: Path) -> None:
    """The error keys live in their own pre-allocated file, so a store that cannot be written still has them."""
    async with opened(tmp_path) as cache:
        await cache.ledger.update(failed={key("a"): "disk full"})
    ledger_file = cache.ledger.path
    assert ledger_file.parent == tmp_path
    assert ledger_file.stat().st_size > 0
    assert stat.S_IMODE(ledger_file.stat().st_mode) == 0o600
    os.remove(tmp_path / "store.sqlite")
    async with opened(tmp_path) as cache:
        assert cache.ledger.errors == {key("a"): "disk full"}


@pytest.mark.parametrize("text", ["abc", "-1"])
async def test_a_deletion_with_an_unreadable_version_changes_nothing(tmp_path: Path, text: str) -> None:
    """A CacheDeleted whose resource version is not a decimal number is logged and ignored."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert("ConfigMap", obj("a", 5)))
        assert not await cache.apply_deleted(CacheDeleted(key=key("a"), resource_version=text))
        assert await versions(cache) == {"a": 5}


async def test_an_object_sent_again_unchanged_writes_and_announces_nothing(tmp_path: Path) -> None:
    """The same object upserted twice is one change; a new version of it is another."""
    async with opened(tmp_path) as cache:
        with cache.subscribe("Node") as changes:
            node = {"metadata": {"name": "edge-1", "resourceVersion": "9"}}
            assert await cache.apply(upsert("Node", node))
            assert await cache.apply(upsert("Node", node))
            assert await cache.apply(upsert("Node", {"metadata": {"name": "edge-1", "resourceVersion": "10"}}))
            seen = [changes.receive_nowait().type for _ in range(2)]
            with pytest.raises(anyio.WouldBlock):
                changes.receive_nowait()
        assert seen == [ChangeType.ADDED, ChangeType.MODIFIED]


async def test_an_erred_key_sent_again_as_cached_is_cleared_and_announces_nothing(tmp_path: Path) -> None:
    """A key a failed relist erred is repaired by the very object the cache holds, without a change."""
    async with opened(tmp_path) as cache:
        await cache.apply(upsert("ConfigMap", obj("kept", 5)))
    async with full(tmp_path) as cache:
        assert not await cache.apply(relist("ConfigMap", 10, obj("kept", 5), obj("new", 9, data="z" * 16 * PAGE)))
        assert set(cache.ledger.errors) == {key("kept"), key("new")}
    async with opened(tmp_path) as cache:
        with cache.subscribe("ConfigMap") as changes:
            assert await cache.apply(upsert("ConfigMap", obj("kept", 5)))
            with pytest.raises(anyio.WouldBlock):
                changes.receive_nowait()
        assert set(cache.ledger.errors) == {key("new")}


_SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(["", "7", "x1", "012"])
_LABELS = st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)
_METADATA = st.fixed_dictionaries(
    {}, optional={"name": _SCALARS, "namespace": _SCALARS, "resourceVersion": _SCALARS, "labels": _LABELS}
)


def _judged(read: Any, raw: Any) -> object:
    """The key and version a row gets from ``raw`` read by ``read``, or the kind of error that stops it."""
    try:
        fields = read(raw)
        return object_key(fields), resource_version(fields)
    except (msgspec.DecodeError, ValueError) as exc:
        return type(exc).__name__ if isinstance(exc, msgspec.DecodeError) else str(exc)


@given(st.dictionaries(st.sampled_from(["kind", "spec", "metadata"]), _METADATA | _SCALARS, max_size=3))
def test_a_rows_key_and_version_are_read_from_the_metadata_alone_as_from_the_whole_object(document: Any) -> None:
    """Reading only name, namespace and resourceVersion gives the same key, version or error as the whole object."""
    raw = msgspec.Raw(msgspec.json.encode(document))
    metadata = document.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        # A metadata that is no object: the whole object reads, its check says "no name"; the fields alone do not
        # decode. Both end the same way: the object is skipped as unreadable.
        assert _judged(_decode, raw) == "object has no metadata.name"
        assert _judged(_key_fields, raw) == "ValidationError"
        return
    assert _judged(_key_fields, raw) == _judged(_decode, raw)
