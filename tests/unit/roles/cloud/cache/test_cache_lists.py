"""Cache streams' lists: a node's collections listed anew after a reconnect, a relist of the watch, a failed list or
a slow edge, in chunks when large, with no watch event lost meanwhile."""

from __future__ import annotations

import anyio
import trio.testing

from nodetask import messages
from nodetask.messages import (
    CacheChunk,
    CacheObjects,
)
from roles.cloud.cache.streams import FRAME_LIMIT
from roles.cloud.sessions import OUTBOUND_QUEUE
from tests.unit.roles.cloud.cache.cluster import (
    CACHE,
    CHUNKS,
    CM,
    NODE,
    POD,
    SECRET,
    beat,
    cluster,
    synced,
)
from tests.unit.roles.cloud.cache_world import (
    POD_DOCS,
    Mirror,
    put_config_map,
    put_node,
    put_pod,
    until,
)
from tests.unit.roles.cloud.doubles import running_hub

BIG_PODS = 6
BIG_ENV = 250_000
"""Five Pods this large are more than one frame holds."""


async def test_reconnecting_replaces_each_collection_from_a_fresh_list(autojump_clock: trio.testing.MockClock) -> None:
    """What changed while the edge was away is in the collections it gets again; the removed objects are not."""
    api = cluster()
    async with running_hub(api) as hub:
        first = await synced(hub, "n0", CACHE)
        await first.edge.close()
        api.delete(POD_DOCS, "p2", "default")
        put_config_map(api, "cm-a", "3")
        put_pod(api, "p4", "n0")
        again = await synced(hub, "n0", CACHE)
    assert again.names(POD) == {"p1", "p4"}
    assert again.names(CM) == {"cm-a"}
    assert again.objects[CM][("default", "cm-a")]["data"] == {"v": "3"}
    assert again.replaces == {NODE: 1, POD: 1, CM: 1}


async def test_pods_over_the_frame_limit_are_relisted_in_chunks_to_an_edge_that_takes_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Pods more than a frame holds go to an edge listing cache.chunks as a replace in chunks, each within
    the edge's frame limit: a Pod deleted while it was away is gone from what it holds once they are in."""
    api = cluster()
    for i in range(BIG_PODS):
        put_pod(api, f"big{i}", "n0", env="x" * BIG_ENV)
    async with running_hub(api) as hub:
        first = await synced(hub, "n0", CHUNKS)
        await first.edge.close()
        api.delete(POD_DOCS, "big0", "default")
        edge = hub[1].connect("n0")
        await edge.hello(capabilities=CHUNKS)
        again = Mirror(edge, held=first.objects)
        await again.until(lambda m: m.has(NODE, POD, CM))
    chunks = [f for f in again.frames if isinstance(f, CacheChunk)]
    assert len(chunks) > 1
    assert {c.kind for c in chunks} == {POD}
    assert all(len(messages.encode(c)) <= FRAME_LIMIT for c in chunks)
    assert again.names(POD) == {"p1", "p2"} | {f"big{i}" for i in range(1, BIG_PODS)}
    assert not any(isinstance(f, CacheObjects) and f.kind == POD for f in again.frames)


async def test_pods_over_the_frame_limit_go_one_by_one_to_an_edge_without_chunks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An edge that does not list cache.chunks gets no chunk: Pods more than a frame holds come as upserts,
    as before, so a Pod deleted while it was away stays in what it holds."""
    api = cluster()
    pods = {"p1", "p2"} | {f"big{i}" for i in range(BIG_PODS)}
    for i in range(BIG_PODS):
        put_pod(api, f"big{i}", "n0", env="x" * BIG_ENV)
    async with running_hub(api) as hub:
        edge = hub[1].connect("n0")
        await edge.hello(capabilities=CACHE)
        first = Mirror(edge)
        await first.until(lambda m: m.has(NODE, CM) and m.names(POD) == pods)
        await edge.close()
        api.delete(POD_DOCS, "big0", "default")
        edge = hub[1].connect("n0")
        await edge.hello(capabilities=CACHE)
        again = Mirror(edge, held=first.objects)
        upserts = len(pods) - 1  # all but the deleted one

        def listed(m: Mirror) -> bool:
            return m.has(NODE, CM) and sum(isinstance(f, CacheObjects) and f.kind == POD for f in m.frames) == upserts

        await again.until(listed)
    assert not any(isinstance(f, CacheChunk) for f in again.frames)
    assert POD not in again.replaces
    assert again.names(POD) == pods


async def test_changes_the_watch_missed_reach_the_edge_once_it_lists_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A ConfigMap changed, a Pod added and one deleted while the watches were broken are sent after their
    relist, and the ConfigMap only the deleted Pod used is deleted."""
    api = cluster()
    async with running_hub(api) as hub:
        n0 = await synced(hub, "n0", CACHE)
        put_config_map(api, "cm-a", "9", tell=False)
        put_pod(api, "p6", "n0", tell=False)
        api.delete(POD_DOCS, "p2", "default", tell=False)
        api.relist("pods")
        api.relist("configmaps")
        api.relist("nodes")
        await n0.until(
            lambda m: (
                m.names(POD) == {"p1", "p6"}
                and m.names(CM) == {"cm-a"}
                and m.objects[CM][("default", "cm-a")]["data"] == {"v": "9"}
            )
        )
    assert n0.replaces[POD] == 2
    assert n0.replaces[NODE] == 1  # the Node had not changed: not sent again


async def test_a_kind_the_hub_cannot_list_is_not_replaced_until_a_retry_lists_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Lists of ConfigMaps refused: Node and Pods arrive, no ConfigMap collection (the edge keeps its own) until
    the lists work again."""
    api = cluster()
    api.refuse_lists.add("configmaps")
    async with running_hub(api) as (hub, door):
        edge = door.connect("n0")
        await edge.hello(capabilities=CACHE)
        mirror = Mirror(edge)
        await mirror.until(lambda m: m.has(NODE, POD))
        with anyio.move_on_after(20):
            await mirror.until(lambda m: m.has(CM))
        assert not mirror.has(CM)
        assert hub.metrics.cache_list_failures.labels(kind=CM)._value.get() >= 2
        api.refuse_lists.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(beat, edge)  # retries are up to a minute apart
            await mirror.until(lambda m: m.has(CM), seconds=120)
            tg.cancel_scope.cancel()
    assert mirror.names(CM) == {"cm-a", "cm-b"}


async def test_a_node_whose_pods_cannot_be_listed_gets_neither_pods_nor_config_maps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without its Pods the hub cannot know their ConfigMaps either: only the Node is sent."""
    api = cluster()
    api.refuse_lists.add("pods")
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello(capabilities=CACHE)
        mirror = Mirror(edge)
        await mirror.until(lambda m: m.has(NODE))
        with anyio.move_on_after(30):
            await mirror.until(lambda m: m.has(POD) or m.has(CM))
    assert set(mirror.replaces) == {NODE}


async def test_one_watch_per_kind_serves_every_session_and_only_what_they_need_is_held(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Five cache sessions share one watch of each kind; ConfigMaps no session needs are not held, and
    nothing is once the sessions end."""
    api = cluster()
    for i in range(2, 5):
        put_node(api, f"n{i}")
        put_pod(api, f"r{i}", f"n{i}", config_maps=("cm-a",))
    async with running_hub(api) as hub:
        mirrors = [await synced(hub, f"n{i}", CACHE) for i in range(5)]
        index = hub[0].cache.index
        assert index.objects.held() == {CM: 3, SECRET: 0}  # cm-a, cm-b, cm-n1: never cm-free
        for mirror in mirrors:
            await mirror.edge.close()
        await until(lambda: not index.feeds)
        assert index.objects.held() == {CM: 0, SECRET: 0}
        assert index.objects.referenced() == 0
        assert not index._pod_nodes
    assert api.watches_opened["pods"] == api.watches_opened["configmaps"] == api.watches_opened["nodes"] == 1
    assert mirrors[3].names(CM) == {"cm-a"}


async def test_watch_events_met_while_a_nodes_list_is_under_way_are_not_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Pod created and one deleted while the node's list is held back are in the collection the edge gets."""
    api = cluster()
    async with running_hub(api) as (_, door):
        api.hold_lists = anyio.Event()
        edge = door.connect("n0")
        await edge.hello(capabilities=CACHE)
        mirror = Mirror(edge)
        await until(lambda: any(plural == "pods" for plural, _, _ in api.lists))
        put_pod(api, "p5", "n0")
        api.delete(POD_DOCS, "p1", "default")
        await trio.testing.wait_all_tasks_blocked()  # the hub has taken both events in while the list is held
        api.hold_lists.set()
        api.hold_lists = None
        await mirror.until(lambda m: m.has(NODE, POD, CM))
    assert mirror.names(POD) == {"p2", "p5"}
    assert mirror.names(CM) == {"cm-b"}


def _env(mirror: Mirror, pod: str) -> str:
    """The value a Pod's container sets (put_pod's ``env``), as the edge holds it; empty when none."""
    obj = mirror.objects.get(POD, {}).get(("default", pod))
    env = obj["spec"]["containers"][0].get("env", []) if obj is not None else []
    return str(env[0]["value"]) if env else ""


async def test_a_slow_edge_is_relisted_and_never_holds_up_the_others(autojump_clock: trio.testing.MockClock) -> None:
    """An edge that stops reading misses frames and is relisted once it reads again; the other edge got every
    change as it happened, never relisted."""
    api = cluster()
    changes = OUTBOUND_QUEUE * 3
    async with running_hub(api) as (hub, door):
        slow = await synced((hub, door), "n0", CACHE)
        fast = await synced((hub, door), "n1", CACHE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(beat, slow.edge)
            tg.start_soon(fast.until, lambda m: _env(m, "q1") == str(changes - 1))
            for i in range(changes):
                put_pod(api, "p2", "n0", config_maps=("cm-b",), env=str(i))
                put_pod(api, "q1", "n1", config_maps=("cm-n1",), env=str(i))
                await anyio.sleep(0.01)
            assert hub.metrics.cache_relists._value.get() >= 1
            # The slow edge reads again: the frames queued before it fell behind, then its collections anew.
            await slow.until(lambda m: m.replaces[POD] >= 2 and _env(m, "p2") == str(changes - 1), seconds=120)
            tg.cancel_scope.cancel()
        assert hub.cache.index.feeds["n1"].behinds == 0
    pod_upserts = [f for f in fast.frames if isinstance(f, CacheObjects) and f.kind == POD and not f.replace]
    assert len(pod_upserts) == changes
    assert slow.names(POD) == {"p1", "p2"}
