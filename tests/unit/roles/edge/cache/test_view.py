"""The in-memory cache behind the local API, and the setting that turns the local API on."""

from __future__ import annotations

import anyio
import msgspec
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream
from hypothesis import given
from hypothesis import strategies as st

from roles.common.config import EdgeConfig, LocalApiConfig
from roles.edge.cache.view import Change, ChangeType, MemoryCache, Object
from schemas.update_fields import key_problem


def obj(name: str, rv: int, *, ns: str = "ns", data: str = "") -> Object:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv)}, "data": {"v": data}}


def drain(changes: MemoryObjectReceiveStream[Change]) -> list[tuple[ChangeType, str, str]]:
    """The changes waiting in a subscription: (type, name, resource version)."""
    out: list[tuple[ChangeType, str, str]] = []
    while True:
        try:
            change = changes.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream):
            return out
        out.append((change.type, change.object["metadata"]["name"], change.object["metadata"]["resourceVersion"]))


ops = st.lists(
    st.tuples(st.sampled_from(["put", "delete"]), st.sampled_from(["a", "b", "c"]), st.integers(1, 20)), max_size=30
)


@given(ops)
async def test_the_newest_version_of_each_object_wins_whatever_the_order(sequence: list[tuple[str, str, int]]) -> None:
    """Puts and deletes applied in any order leave each object as its newest version says, as a model has it."""
    cache, model = MemoryCache(), dict[str, int]()
    for op, name, rv in sequence:
        current = model.get(name)
        if op == "put":
            cache.put("ConfigMap", obj(name, rv))
            if current is None or current <= rv:
                model[name] = rv
        else:
            cache.delete("ConfigMap", obj(name, rv))
            if current is not None and current <= rv:
                del model[name]
    listing = await cache.list("ConfigMap", "")
    assert {o["metadata"]["name"]: int(o["metadata"]["resourceVersion"]) for o in listing.items} == model


async def test_an_older_version_is_ignored_and_not_announced() -> None:
    """A stale put or delete changes nothing and tells no subscriber."""
    cache = MemoryCache()
    cache.put("Pod", obj("a", 5, data="new"))
    with cache.subscribe("Pod") as changes:
        cache.put("Pod", obj("a", 4, data="old"))
        cache.delete("Pod", obj("a", 3))
        assert drain(changes) == []
    got = await cache.get("Pod", "ns", "a")
    assert got is not None
    assert got["data"] == {"v": "new"}


async def test_subscribers_see_their_kinds_changes_from_when_they_subscribed() -> None:
    """A subscriber is told of adds, updates (with the object before) and deletes of its kind only."""
    cache = MemoryCache()
    cache.put("Pod", obj("before", 1))
    with cache.subscribe("Pod") as changes:
        cache.put("Pod", obj("a", 2))
        cache.put("ConfigMap", obj("c", 3))
        cache.put("Pod", obj("a", 4, data="x"))
        cache.delete("Pod", obj("a", 5))
        assert drain(changes) == [
            (ChangeType.ADDED, "a", "2"),
            (ChangeType.MODIFIED, "a", "4"),
            (ChangeType.DELETED, "a", "5"),
        ]


async def test_a_fresh_list_replaces_the_collection_and_reports_the_difference() -> None:
    """Replacing a kind's objects tells subscribers what was added, changed and removed, at the list's version."""
    cache = MemoryCache()
    for o in (obj("kept", 1), obj("changed", 2), obj("gone", 3)):
        cache.put("Secret", o)
    with cache.subscribe("Secret") as changes:
        cache.replace("Secret", [obj("kept", 1), obj("changed", 7, data="x"), obj("new", 8)], "9")
        assert sorted(drain(changes)) == [
            (ChangeType.ADDED, "new", "8"),
            (ChangeType.DELETED, "gone", "9"),
            (ChangeType.MODIFIED, "changed", "7"),
        ]
    listing = await cache.list("Secret", "ns")
    assert ([o["metadata"]["name"] for o in listing.items], listing.resource_version) == (
        ["changed", "kept", "new"],
        "9",
    )


async def test_a_subscriber_that_falls_behind_is_ended_not_skipped() -> None:
    """Past its buffer a subscriber's stream ends after the changes it holds; the cache itself never waits."""
    cache = MemoryCache(subscriber_buffer=2)
    with cache.subscribe("Pod") as changes:
        for rv in range(1, 5):
            cache.put("Pod", obj(f"p{rv}", rv))
        assert [name for _, name, _ in drain(changes)] == ["p1", "p2"]
        with pytest.raises(anyio.EndOfStream):
            changes.receive_nowait()


@pytest.mark.parametrize("bad", [{"metadata": {"name": "a"}}, {"metadata": {"name": "a", "resourceVersion": "x1"}}, {}])
def test_objects_without_a_numeric_version_or_name_are_rejected(bad: Object) -> None:
    """The cache takes only objects as the cloud sends them: named, with a decimal resource version."""
    with pytest.raises(ValueError, match=r"metadata\.(name|resourceVersion)"):
        MemoryCache().put("Pod", bad)


# -------------------------------------------------------------------------------------------- the setting


def test_the_local_api_is_off_unless_configured() -> None:
    """An edge config without ``localApi`` has it off, on port 10261, without Secrets."""
    assert EdgeConfig().local_api == LocalApiConfig(enabled=False, port=10261, serve_secrets=False)
    cfg = msgspec.convert({"localApi": {"port": 18000, "serveSecrets": True}}, EdgeConfig)
    assert cfg.local_api == LocalApiConfig(enabled=False, port=18000, serve_secrets=True)


def test_the_local_api_can_be_enabled_now_that_its_cache_exists() -> None:
    """``localApi.enabled`` is accepted (the durable cache serves it), and the repair period has its default."""
    cfg = msgspec.convert({"localApi": {"enabled": True}}, EdgeConfig)
    assert cfg.local_api.enabled
    assert cfg.autonomy.repair_period == 30.0
    with pytest.raises(msgspec.ValidationError, match=r"\$\.autonomy\.repairPeriod"):
        msgspec.convert({"autonomy": {"repairPeriod": 0}}, EdgeConfig)


@pytest.mark.parametrize(
    ("setting", "says"),
    [({"port": 0}, r"\$\.localApi\.port"), ({"host": "0.0.0.0"}, "unknown field `host`")],
)
def test_local_api_settings_are_checked(setting: dict[str, object], says: str) -> None:
    """A port out of range or an unknown key (there is no listening address to set) is refused, named."""
    with pytest.raises(msgspec.ValidationError, match=says):
        msgspec.convert({"localApi": setting}, EdgeConfig)


def test_a_config_update_job_cannot_turn_the_local_api_on() -> None:
    """Whoever may create jobs must not open every device's local API: ``localApi`` is not updatable."""
    assert "localApi" not in EdgeConfig.UPDATABLE_FIELDS
    assert key_problem("localApi", EdgeConfig.UPDATABLE_FIELDS)
