"""Cache streams: each cache edge kept its node's Node, Pods, and the ConfigMaps and Secrets they reference."""

from __future__ import annotations

import functools

import anyio
import trio.testing

from nodetask import messages
from nodetask.autonomy import AUTONOMY_ANNOTATION, DURATION_ANNOTATION
from nodetask.messages import (
    CACHE_CAPABILITY,
    CACHE_CHUNKS_CAPABILITY,
    CACHE_SECRETS_CAPABILITY,
    Autonomy,
    CacheChunk,
    CacheDeleted,
    CacheFetch,
    CacheKey,
    CacheObjects,
    Error,
    Heartbeat,
    Welcome,
)
from roles.cloud.cache.streams import FRAME_LIMIT
from roles.cloud.hub import Hub
from roles.cloud.sessions import OUTBOUND_QUEUE
from tests.unit.roles.cloud.cache_world import (
    POD_DOCS,
    Mirror,
    put_config_map,
    put_node,
    put_pod,
    put_secret,
    until,
)
from tests.unit.roles.cloud.doubles import FakeEdge, MemoryApi, MemoryDoor, running_hub

CACHE = (CACHE_CAPABILITY,)
WITH_SECRETS = (CACHE_CAPABILITY, CACHE_SECRETS_CAPABILITY)
CHUNKS = (CACHE_CAPABILITY, CACHE_CHUNKS_CAPABILITY)
BIG_PODS = 6
BIG_ENV = 250_000
"""Five Pods this large are more than one frame holds."""


def _cache_offered(welcome: Welcome) -> tuple[str, ...]:
    """The cache capabilities a Welcome lists (it lists others too, such as pings)."""
    return tuple(c for c in welcome.capabilities if c.startswith("cache."))


POD, NODE, CM, SECRET = "Pod", "Node", "ConfigMap", "Secret"


def _cluster() -> MemoryApi:
    """Nodes n0 (asking for autonomy) and n1; n0's Pods use cm-a, cm-b and s-a; n1's uses cm-n1 and s-n1;
    cm-free and s-free are nobody's."""
    api = MemoryApi()
    put_node(api, "n0", {AUTONOMY_ANNOTATION: "true"})
    put_node(api, "n1")
    for name in ("cm-a", "cm-b", "cm-n1", "cm-free"):
        put_config_map(api, name)
    for name in ("s-a", "s-n1", "s-free"):
        put_secret(api, name)
    put_pod(api, "p1", "n0", config_maps=("cm-a",), secrets=("s-a",))
    put_pod(api, "p2", "n0", config_maps=("cm-b",))
    put_pod(api, "q1", "n1", config_maps=("cm-n1",), secrets=("s-n1",))
    return api


async def _beat(edge: FakeEdge) -> None:
    """Heartbeats every 5 s, so that the hub keeps a session whose edge is not reading."""
    while True:
        await edge.send(Heartbeat(sent_at=anyio.current_time()))
        await anyio.sleep(5)


async def _synced(hub_door: tuple[Hub, MemoryDoor], node: str, capabilities: tuple[str, ...]) -> Mirror:
    """An edge of ``node`` connected and sent its collections (Node, Pod, ConfigMap; Secret if it gets them)."""
    hub, door = hub_door
    edge = door.connect(node)
    welcome = await edge.hello(capabilities=capabilities)
    offered = (*CACHE, CACHE_CHUNKS_CAPABILITY, *((CACHE_SECRETS_CAPABILITY,) if hub.settings.cache_secrets else ()))
    assert _cache_offered(welcome) == offered
    mirror = Mirror(edge)
    secrets = CACHE_SECRETS_CAPABILITY in capabilities and hub.settings.cache_secrets
    await mirror.until(lambda m: m.has(*((NODE, POD, CM, SECRET) if secrets else (NODE, POD, CM))))
    return mirror


async def test_a_cache_edge_gets_the_autonomy_request_and_exactly_its_nodes_objects(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After Welcome (listing cache.v1): Autonomy, then its Node, its Pods and the ConfigMaps they use, no more."""
    api = _cluster()
    async with running_hub(api) as hub:
        n0 = await _synced(hub, "n0", CACHE)
    assert n0.autonomy() == [True]
    node_replace = next(i for i, f in enumerate(n0.frames) if isinstance(f, CacheObjects) and f.kind == NODE)
    assert n0.frames.index(Autonomy(requested=True)) < node_replace
    assert n0.names(NODE) == {"n0"}
    assert n0.names(POD) == {"p1", "p2"}
    assert n0.names(CM) == {"cm-a", "cm-b"}
    assert not any(isinstance(f, CacheObjects) and f.kind == SECRET for f in n0.frames)
    pod = n0.objects[POD][("default", "p1")]
    assert (pod["kind"], pod["apiVersion"]) == ("Pod", "v1")
    assert "managedFields" not in pod["metadata"]
    assert pod["spec"]["volumes"][0]["configMap"] == {"name": "cm-a"}
    assert n0.objects[CM][("default", "cm-a")]["data"] == {"v": "1"}


async def test_secrets_go_only_to_edges_listing_cache_secrets_from_a_hub_caching_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With cacheSecrets (which the Welcome lists, so that edges keeping Secrets know a relist of them is to
    come), an edge listing cache.secrets gets the Secrets its Pods use; one not listing it gets none."""
    api = _cluster()
    async with running_hub(api, cache_secrets=True) as hub:
        n0 = await _synced(hub, "n0", WITH_SECRETS)
        n1 = await _synced(hub, "n1", CACHE)
    assert n0.names(SECRET) == {"s-a"}
    assert not any(isinstance(f, CacheObjects) and f.kind == SECRET for f in n1.frames)
    async with running_hub(api) as hub:
        n0_without = await _synced(hub, "n0", WITH_SECRETS)
        assert hub[0].cache.kinds() == (NODE, POD, CM)
    assert not any(isinstance(f, CacheObjects) and f.kind == SECRET for f in n0_without.frames)


async def test_a_node_never_receives_a_secret_no_pod_of_its_references_even_by_fetching_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Fetching another node's Secret (which the hub holds for that node), a free Secret, another node's Pod or
    ConfigMap answers CacheDeleted."""
    api = _cluster()
    async with running_hub(api, cache_secrets=True) as hub:
        await _synced(hub, "n1", WITH_SECRETS)
        n0 = await _synced(hub, "n0", WITH_SECRETS)
        assert hub[0].cache.index.objects.held() == {CM: 3, SECRET: 2}
        foreign = (
            CacheKey(kind=SECRET, namespace="default", name="s-n1"),
            CacheKey(kind=SECRET, namespace="default", name="s-free"),
            CacheKey(kind=SECRET, namespace="kube-system", name="s-a"),
            CacheKey(kind=POD, namespace="default", name="q1"),
            CacheKey(kind=CM, namespace="default", name="cm-n1"),
            CacheKey(kind=NODE, name="n1"),
        )
        own = (
            CacheKey(kind=SECRET, namespace="default", name="s-a"),
            CacheKey(kind=POD, namespace="default", name="p1"),
        )
        await n0.edge.send(CacheFetch(keys=(*foreign, *own)))
        await n0.until(
            lambda m: (
                sum(isinstance(f, CacheDeleted) for f in m.frames) >= len(foreign)
                and sum(isinstance(f, CacheObjects) and not f.replace and f.kind != NODE for f in m.frames) >= len(own)
            )
        )
    assert [f.key for f in n0.frames if isinstance(f, CacheDeleted)] == list(foreign)
    for name in ("s-n1", "s-free"):
        assert not n0.ever_sent(SECRET, name)
    assert not n0.ever_sent(POD, "q1")
    assert not n0.ever_sent(CM, "cm-n1")
    assert not n0.ever_sent(NODE, "n1")
    # (The hub's own mark on the Node comes as an upsert of the Node too.)
    upserts = [f for f in n0.frames if isinstance(f, CacheObjects) and not f.replace and f.kind != NODE]
    assert sorted(f.kind for f in upserts) == [POD, SECRET]


async def test_changes_follow_as_upserts_and_deletions_and_other_nodes_changes_do_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A changed ConfigMap, a new Pod and a deleted Pod reach the edge; another node's Pod does not."""
    api = _cluster()
    async with running_hub(api) as hub:
        n0 = await _synced(hub, "n0", CACHE)
        put_config_map(api, "cm-a", "2")
        await n0.until(lambda m: m.objects[CM][("default", "cm-a")]["data"] == {"v": "2"})
        put_pod(api, "q1", "n1", config_maps=("cm-n1",), env="changed")
        put_config_map(api, "cm-free", "2")
        put_pod(api, "p3", "n0")
        await n0.until(lambda m: "p3" in m.names(POD))
        api.delete(POD_DOCS, "p3", "default")
        await n0.until(lambda m: "p3" not in m.names(POD))
    # (The hub's own mark on the Node comes as an upsert of the Node too.)
    changes = [f for f in n0.frames if not isinstance(f, Autonomy) and getattr(f, "kind", "") != NODE]
    changes = changes[[getattr(f, "replace", False) for f in changes].index(False) :]
    assert [(type(f).__name__, getattr(f, "kind", "")) for f in changes] == [
        ("CacheObjects", CM),
        ("CacheObjects", POD),
        ("CacheDeleted", ""),
    ]
    assert not n0.ever_sent(POD, "q1")
    assert not n0.ever_sent(CM, "cm-free")


async def test_objects_stop_reaching_the_edge_when_no_longer_its_nodes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A ConfigMap no Pod references any more is deleted on the edge and a newly referenced one sent; a Pod
    bound elsewhere is deleted with the ConfigMap only it used, which the hub then forgets."""
    api = _cluster()
    async with running_hub(api) as hub:
        n0 = await _synced(hub, "n0", CACHE)
        put_pod(api, "p1", "n0", config_maps=("cm-free",))
        await n0.until(lambda m: m.names(CM) == {"cm-free", "cm-b"})
        put_pod(api, "p2", "n1", config_maps=("cm-b",))
        await n0.until(lambda m: m.names(POD) == {"p1"} and m.names(CM) == {"cm-free"})
        assert hub[0].cache.index.objects.held() == {CM: 1, SECRET: 0}
    deleted = [(f.key.kind, f.key.name) for f in n0.frames if isinstance(f, CacheDeleted)]
    assert deleted == [(CM, "cm-a"), (POD, "p2"), (CM, "cm-b")]


async def test_reconnecting_replaces_each_collection_from_a_fresh_list(autojump_clock: trio.testing.MockClock) -> None:
    """What changed while the edge was away is in the collections it gets again; the removed objects are not."""
    api = _cluster()
    async with running_hub(api) as hub:
        first = await _synced(hub, "n0", CACHE)
        await first.edge.close()
        api.delete(POD_DOCS, "p2", "default")
        put_config_map(api, "cm-a", "3")
        put_pod(api, "p4", "n0")
        again = await _synced(hub, "n0", CACHE)
    assert again.names(POD) == {"p1", "p4"}
    assert again.names(CM) == {"cm-a"}
    assert again.objects[CM][("default", "cm-a")]["data"] == {"v": "3"}
    assert again.replaces == {NODE: 1, POD: 1, CM: 1}


async def test_pods_over_the_frame_limit_are_relisted_in_chunks_to_an_edge_that_takes_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Pods more than a frame holds go to an edge listing cache.chunks as a replace in chunks, each within
    the edge's frame limit: a Pod deleted while it was away is gone from what it holds once they are in."""
    api = _cluster()
    for i in range(BIG_PODS):
        put_pod(api, f"big{i}", "n0", env="x" * BIG_ENV)
    async with running_hub(api) as hub:
        first = await _synced(hub, "n0", CHUNKS)
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
    api = _cluster()
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
    api = _cluster()
    async with running_hub(api) as hub:
        n0 = await _synced(hub, "n0", CACHE)
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
    api = _cluster()
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
            tg.start_soon(_beat, edge)  # retries are up to a minute apart
            await mirror.until(lambda m: m.has(CM), seconds=120)
            tg.cancel_scope.cancel()
    assert mirror.names(CM) == {"cm-a", "cm-b"}


async def test_a_node_whose_pods_cannot_be_listed_gets_neither_pods_nor_config_maps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without its Pods the hub cannot know their ConfigMaps either: only the Node is sent."""
    api = _cluster()
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
    api = _cluster()
    for i in range(2, 5):
        put_node(api, f"n{i}")
        put_pod(api, f"r{i}", f"n{i}", config_maps=("cm-a",))
    async with running_hub(api) as hub:
        mirrors = [await _synced(hub, f"n{i}", CACHE) for i in range(5)]
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
    api = _cluster()
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
    api = _cluster()
    changes = OUTBOUND_QUEUE * 3
    async with running_hub(api) as (hub, door):
        slow = await _synced((hub, door), "n0", CACHE)
        fast = await _synced((hub, door), "n1", CACHE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_beat, slow.edge)
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


def _node_at(mirror: Mirror, *, rv: str) -> bool:
    return bool(mirror.objects[NODE][("", "n1")]["metadata"]["resourceVersion"] == rv)


async def test_the_autonomy_request_is_sent_again_only_when_the_annotations_change_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Not requested, then a duration asks for it, a longer one changes nothing, an unparsable one withdraws it."""
    api = _cluster()
    async with running_hub(api) as hub:
        n1 = await _synced(hub, "n1", CACHE)
        for value in ("1h", "2h", "soon"):
            stored = put_node(api, "n1", {DURATION_ANNOTATION: value})
            rv = stored.metadata.resource_version
            await n1.until(functools.partial(_node_at, rv=rv))
    assert n1.autonomy() == [False, True, False]


async def test_cache_messages_from_an_edge_that_did_not_list_cache_v1_are_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An edge without cache.v1 gets no cache frames, and its CacheFetch is answered with an Error."""
    api = _cluster()
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello()
        await edge.send(CacheFetch(keys=(CacheKey(kind=POD, namespace="default", name="p1"),)))
        assert (await edge.next_of(Error)).code == "unexpected"


async def test_a_hub_with_cache_streams_off_offers_and_watches_nothing(autojump_clock: trio.testing.MockClock) -> None:
    """cacheStreams false: Welcome lists no cache capability and no Pod or ConfigMap is watched."""
    api = _cluster()
    async with running_hub(api, cache_streams=False) as (_, door):
        edge = door.connect("n0")
        welcome = await edge.hello(capabilities=CACHE)
        frames = await edge.frames_within(5)
    assert _cache_offered(welcome) == ()
    assert frames == []
    assert api.watches_opened["pods"] == api.watches_opened["configmaps"] == 0
