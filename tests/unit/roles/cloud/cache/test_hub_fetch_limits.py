"""What an edge with a valid token can make its hub ask of the API server by fetching its cache again."""

from __future__ import annotations

import math

import anyio
import pytest
import trio.testing

from nodetask.messages import CACHE_CAPABILITY, CacheDeleted, CacheFetch, CacheKey, CacheObjects, Error
from roles.cloud.cache.streams import MAX_FETCH_KEYS
from roles.cloud.cache.token_bucket import TokenBucket, take
from roles.cloud.role import settings_of
from roles.common.config import CloudConfig, ConfigError, load_config
from tests.unit.roles.cloud.cache_world import Mirror, put_config_map, put_node, put_pod, until
from tests.unit.roles.cloud.doubles import MemoryApi, MemoryDoor, running_hub

NODE, POD, CM = "Node", "Pod", "ConfigMap"
OWN_NODE = CacheKey(kind=NODE, name="n0")
OWN_POD = CacheKey(kind=POD, namespace="default", name="p1")
OWN_CM = CacheKey(kind=CM, namespace="default", name="cm-a")


def _cluster() -> MemoryApi:
    """Node n0, with Pod p1 using cm-a."""
    api = MemoryApi()
    put_node(api, "n0")
    put_config_map(api, "cm-a")
    put_pod(api, "p1", "n0", config_maps=("cm-a",))
    return api


def _lists(api: MemoryApi, plural: str) -> int:
    return sum(1 for listed, _, _ in api.lists if listed == plural)


async def _synced(door: MemoryDoor) -> Mirror:
    edge = door.connect("n0")
    await edge.hello(capabilities=(CACHE_CAPABILITY,))
    mirror = Mirror(edge)
    await mirror.until(lambda m: m.has(NODE, POD, CM))
    return mirror


async def _read_all(mirror: Mirror) -> None:
    """Keep reading what the hub sends (an edge that keeps up)."""
    while True:
        mirror.apply(await mirror.edge.receive())


def test_a_bucket_gives_its_burst_at_once_then_its_rate_and_a_refusal_takes_nothing() -> None:
    """A full bucket of 10 at 2 a second gives 10, refuses 1, gives 2 a second later and never holds more than 10."""
    bucket = TokenBucket.full(rate=2.0, burst=10.0, now=0.0)
    spent = take(bucket, 10, 0.0)
    assert spent is not None
    assert take(spent, 1, 0.0) is None
    refilled = take(spent, 2, 1.0)
    assert refilled is not None
    assert refilled.tokens == 0.0
    assert take(spent, 11, 3600.0) is None
    later = take(spent, 10, 3600.0)
    assert later is not None
    assert later.tokens == 0.0


def test_the_limits_are_cloud_settings_and_a_burst_smaller_than_one_frame_is_refused() -> None:
    """cacheFetchRate, cacheFetchBurst and autonomyConditionInterval reach the hub; a burst below 256 keys (one
    frame's most) would refuse the largest frames for ever, and is a config error naming the key."""
    cfg = load_config("cloud", None, {"cacheFetchRate": 5, "cacheFetchBurst": 300, "autonomyConditionInterval": 30})
    assert isinstance(cfg, CloudConfig)
    settings = settings_of(cfg)
    assert (settings.cache_fetch_rate, settings.cache_fetch_burst, settings.autonomy_condition_interval) == (5, 300, 30)
    with pytest.raises(ConfigError, match="cacheFetchBurst"):
        load_config("cloud", None, {"cacheFetchBurst": MAX_FETCH_KEYS - 1})


async def test_a_fetch_flood_of_the_nodes_own_node_costs_a_bounded_number_of_lists(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Ten frames a second of 256 keys naming the node's Node, for 36 s: within the session's burst and rate,
    each frame costs one read at most, the rest are refused with rate_limited naming both settings, and the
    session goes on."""
    api = _cluster()
    rate, burst, seconds, per_second = 20.0, 1000, 36, 10
    async with running_hub(api, cache_fetch_rate=rate, cache_fetch_burst=burst) as (hub, door):
        mirror = await _synced(door)
        before = _lists(api, "nodes")
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_all, mirror)
            for _ in range(seconds * per_second):
                await mirror.edge.send(CacheFetch(keys=(OWN_NODE,) * MAX_FETCH_KEYS))
                await anyio.sleep(1 / per_second)
            await anyio.sleep(5)  # every answer is in
            tg.cancel_scope.cancel()
        assert "n0" in hub.sessions
    accepted = math.floor((burst + rate * seconds) / MAX_FETCH_KEYS)
    assert _lists(api, "nodes") - before <= accepted
    errors = [f for f in mirror.frames if isinstance(f, Error)]
    assert len(errors) >= seconds * per_second - accepted
    assert {e.code for e in errors} == {"rate_limited"}
    assert "cacheFetchRate" in errors[0].message
    assert "cacheFetchBurst" in errors[0].message
    answers = [f for f in mirror.frames if isinstance(f, CacheObjects) and f.kind == NODE and not f.replace]
    assert answers  # what was not refused was answered


async def test_a_key_asked_for_again_while_its_read_waits_is_read_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The node's Node and Pod asked for four times while the API server holds the first reads: one list each,
    each answered once it returns; a ConfigMap the hub holds is answered with no list at all."""
    api = _cluster()
    async with running_hub(api) as (_, door):
        mirror = await _synced(door)
        nodes, pods, config_maps = _lists(api, "nodes"), _lists(api, "pods"), _lists(api, "configmaps")
        api.hold_lists = anyio.Event()
        for _ in range(4):
            await mirror.edge.send(CacheFetch(keys=(OWN_NODE, OWN_POD, OWN_CM, OWN_NODE)))
        await until(lambda: _lists(api, "pods") > pods)
        await anyio.sleep(5)
        assert (_lists(api, "nodes") - nodes, _lists(api, "pods") - pods) == (1, 1)
        api.hold_lists.set()
        api.hold_lists = None
        await mirror.until(lambda m: _upserts(m, POD) == 1 and _upserts(m, CM) == 4)
        await anyio.sleep(5)
    assert _lists(api, "configmaps") == config_maps
    assert (_upserts(mirror, POD), _upserts(mirror, CM)) == (1, 4)
    assert not any(isinstance(f, (Error, CacheDeleted)) for f in mirror.frames)


def _upserts(mirror: Mirror, kind: str) -> int:
    return sum(1 for f in mirror.frames if isinstance(f, CacheObjects) and f.kind == kind and not f.replace)


async def test_reconnecting_does_not_refill_what_a_node_may_fetch(autojump_clock: trio.testing.MockClock) -> None:
    """An edge that spent its burst and reconnects at once is still refused; once its rate has refilled the
    burst (with no session meanwhile), its next session may fetch again."""
    api = _cluster()
    burst, rate = 512, 1.0
    async with running_hub(api, cache_fetch_burst=burst, cache_fetch_rate=rate) as (_, door):
        mirror = await _synced(door)
        for _ in range(burst // MAX_FETCH_KEYS):
            await mirror.edge.send(CacheFetch(keys=(OWN_CM,) * MAX_FETCH_KEYS))
        await mirror.edge.close()
        again = await _synced(door)
        await again.edge.send(CacheFetch(keys=(OWN_CM,) * MAX_FETCH_KEYS))
        await again.until(lambda m: any(isinstance(f, Error) for f in m.frames))
        await again.edge.close()
        await anyio.sleep(burst / rate)
        rested = await _synced(door)
        await rested.edge.send(CacheFetch(keys=(OWN_CM,)))
        await rested.until(lambda m: _upserts(m, CM) == 1)
    assert [f.code for f in again.frames if isinstance(f, Error)] == ["rate_limited"]
    assert _upserts(again, CM) == 0
    assert not any(isinstance(f, Error) for f in rested.frames)
