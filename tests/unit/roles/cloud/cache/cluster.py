"""What the cache streams' tests share: a cluster of two nodes, and an edge synced with it."""

from __future__ import annotations

import anyio

from nodetask.autonomy import AUTONOMY_ANNOTATION
from nodetask.messages import (
    CACHE_CAPABILITY,
    CACHE_CHUNKS_CAPABILITY,
    CACHE_SECRETS_CAPABILITY,
    Heartbeat,
    Welcome,
)
from roles.cloud.hub import Hub
from tests.unit.roles.cloud.cache_world import (
    Mirror,
    put_config_map,
    put_node,
    put_pod,
    put_secret,
)
from tests.unit.roles.cloud.doubles import FakeEdge, MemoryApi, MemoryDoor

POD, NODE, CM, SECRET = "Pod", "Node", "ConfigMap", "Secret"

CACHE = (CACHE_CAPABILITY,)
WITH_SECRETS = (CACHE_CAPABILITY, CACHE_SECRETS_CAPABILITY)
CHUNKS = (CACHE_CAPABILITY, CACHE_CHUNKS_CAPABILITY)


def cache_offered(welcome: Welcome) -> tuple[str, ...]:
    """The cache capabilities a Welcome lists (it lists others too, such as pings)."""
    return tuple(c for c in welcome.capabilities if c.startswith("cache."))


def cluster() -> MemoryApi:
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


async def beat(edge: FakeEdge) -> None:
    """Heartbeats every 5 s, so that the hub keeps a session whose edge is not reading."""
    while True:
        await edge.send(Heartbeat(sent_at=anyio.current_time()))
        await anyio.sleep(5)


async def synced(hub_door: tuple[Hub, MemoryDoor], node: str, capabilities: tuple[str, ...]) -> Mirror:
    """An edge of ``node`` connected and sent its collections (Node, Pod, ConfigMap; Secret if it gets them)."""
    hub, door = hub_door
    edge = door.connect(node)
    welcome = await edge.hello(capabilities=capabilities)
    offered = (*CACHE, CACHE_CHUNKS_CAPABILITY, *((CACHE_SECRETS_CAPABILITY,) if hub.settings.cache_secrets else ()))
    assert cache_offered(welcome) == offered
    mirror = Mirror(edge)
    secrets = CACHE_SECRETS_CAPABILITY in capabilities and hub.settings.cache_secrets
    await mirror.until(lambda m: m.has(*((NODE, POD, CM, SECRET) if secrets else (NODE, POD, CM))))
    return mirror
