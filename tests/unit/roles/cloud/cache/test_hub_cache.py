"""Cache streams: each cache edge kept its node's Node, Pods, and the ConfigMaps and Secrets they reference."""

from __future__ import annotations

import functools

import trio.testing

from nodetask.autonomy import DURATION_ANNOTATION
from nodetask.messages import (
    Autonomy,
    CacheDeleted,
    CacheFetch,
    CacheKey,
    CacheObjects,
    Error,
)
from tests.unit.roles.cloud.cache.cluster import (
    CACHE,
    CM,
    NODE,
    POD,
    SECRET,
    WITH_SECRETS,
    cache_offered,
    cluster,
    synced,
)
from tests.unit.roles.cloud.cache_world import (
    POD_DOCS,
    Mirror,
    put_config_map,
    put_node,
    put_pod,
)
from tests.unit.roles.cloud.doubles import running_hub


async def test_a_cache_edge_gets_the_autonomy_request_and_exactly_its_nodes_objects(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After Welcome (listing cache.v1): Autonomy, then its Node, its Pods and the ConfigMaps they use, no more."""
    api = cluster()
    async with running_hub(api) as hub:
        n0 = await synced(hub, "n0", CACHE)
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
    api = cluster()
    async with running_hub(api, cache_secrets=True) as hub:
        n0 = await synced(hub, "n0", WITH_SECRETS)
        n1 = await synced(hub, "n1", CACHE)
    assert n0.names(SECRET) == {"s-a"}
    assert not any(isinstance(f, CacheObjects) and f.kind == SECRET for f in n1.frames)
    async with running_hub(api) as hub:
        n0_without = await synced(hub, "n0", WITH_SECRETS)
        assert hub[0].cache.kinds() == (NODE, POD, CM)
    assert not any(isinstance(f, CacheObjects) and f.kind == SECRET for f in n0_without.frames)


async def test_a_node_never_receives_a_secret_no_pod_of_its_references_even_by_fetching_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Fetching another node's Secret (which the hub holds for that node), a free Secret, another node's Pod or
    ConfigMap answers CacheDeleted."""
    api = cluster()
    async with running_hub(api, cache_secrets=True) as hub:
        await synced(hub, "n1", WITH_SECRETS)
        n0 = await synced(hub, "n0", WITH_SECRETS)
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
    api = cluster()
    async with running_hub(api) as hub:
        n0 = await synced(hub, "n0", CACHE)
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
    api = cluster()
    async with running_hub(api) as hub:
        n0 = await synced(hub, "n0", CACHE)
        put_pod(api, "p1", "n0", config_maps=("cm-free",))
        await n0.until(lambda m: m.names(CM) == {"cm-free", "cm-b"})
        put_pod(api, "p2", "n1", config_maps=("cm-b",))
        await n0.until(lambda m: m.names(POD) == {"p1"} and m.names(CM) == {"cm-free"})
        assert hub[0].cache.index.objects.held() == {CM: 1, SECRET: 0}
    deleted = [(f.key.kind, f.key.name) for f in n0.frames if isinstance(f, CacheDeleted)]
    assert deleted == [(CM, "cm-a"), (POD, "p2"), (CM, "cm-b")]


def _node_at(mirror: Mirror, *, rv: str) -> bool:
    return bool(mirror.objects[NODE][("", "n1")]["metadata"]["resourceVersion"] == rv)


async def test_the_autonomy_request_is_sent_again_only_when_the_annotations_change_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Not requested, then a duration asks for it, a longer one changes nothing, an unparsable one withdraws it."""
    api = cluster()
    async with running_hub(api) as hub:
        n1 = await synced(hub, "n1", CACHE)
        for value in ("1h", "2h", "soon"):
            stored = put_node(api, "n1", {DURATION_ANNOTATION: value})
            rv = stored.metadata.resource_version
            await n1.until(functools.partial(_node_at, rv=rv))
    assert n1.autonomy() == [False, True, False]


async def test_cache_messages_from_an_edge_that_did_not_list_cache_v1_are_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An edge without cache.v1 gets no cache frames, and its CacheFetch is answered with an Error."""
    api = cluster()
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello()
        await edge.send(CacheFetch(keys=(CacheKey(kind=POD, namespace="default", name="p1"),)))
        assert (await edge.next_of(Error)).code == "unexpected"


async def test_a_hub_with_cache_streams_off_offers_and_watches_nothing(autojump_clock: trio.testing.MockClock) -> None:
    """cacheStreams false: Welcome lists no cache capability and no Pod or ConfigMap is watched."""
    api = cluster()
    async with running_hub(api, cache_streams=False) as (_, door):
        edge = door.connect("n0")
        welcome = await edge.hello(capabilities=CACHE)
        frames = await edge.frames_within(5)
    assert cache_offered(welcome) == ()
    assert frames == []
    assert api.watches_opened["pods"] == api.watches_opened["configmaps"] == 0
