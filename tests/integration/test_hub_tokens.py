"""Edge tokens on the real control plane: labelled Secrets are watched, others read; rotation is immediate."""

from __future__ import annotations

import base64

import anyio
import msgspec
import pytest
import trio_websocket

from roles.cloud.transport.auth import TOKEN_KEY, TOKEN_LABEL, token_secret_name
from roles.kube.resources import SECRETS
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import TOKEN_NAMESPACE, admin, grant_secret_reads, register_edges
from tests.integration.hubs import RunningHub, eventually, running_hub
from tests.integration.objects import unique

pytestmark = pytest.mark.integration
READS = "nodetaskd_hub_token_reads_total"


async def handshake(hub: RunningHub, node: str, token: str) -> int:
    """101 when the hub accepts ``token`` for ``node``, else the status it refused with."""
    headers = [(b"authorization", f"Bearer {token}".encode())]
    try:
        async with trio_websocket.open_websocket_url(f"{hub.url}/nodes/{node}", extra_headers=headers):
            return 101
    except trio_websocket.ConnectionRejected as rejected:
        return rejected.status_code or 0


async def refused_within(limit_s: float, hub: RunningHub, node: str, token: str) -> None:
    """Wait until the hub refuses ``token`` for ``node`` with 403; fail after ``limit_s`` seconds."""
    with anyio.fail_after(limit_s):
        while True:
            if await handshake(hub, node, token) == 403:
                return
            await anyio.sleep(0.05)


def reads(hub: RunningHub) -> float:
    return hub.registry.get_sample_value(READS) or 0.0


async def test_edges_with_labelled_token_secrets_connect_without_a_secret_read(crds: ControlPlane) -> None:
    """Once the watch has listed the labelled Secrets, a fleet's handshakes cost the API server nothing."""
    nodes = [unique("watched") for _ in range(5)]
    tokens = await register_edges(crds, nodes)
    async with running_hub(crds, "hub-tokens") as hub:
        await eventually(lambda: all(hub.hub.tokens.watching(n) for n in nodes))
        assert [await handshake(hub, n, tokens[n]) for n in nodes] == [101] * 5
        assert await handshake(hub, nodes[0], tokens[nodes[1]]) == 403
        # Only the refused handshake read a Secret: a mismatch is always checked against the API.
        assert reads(hub) == 1


async def test_an_unlabelled_token_secret_is_read_when_its_edge_connects(crds: ControlPlane) -> None:
    """Secrets created before the label existed still work: the hub reads each one once."""
    node = unique("unlabelled")
    tokens = await register_edges(crds, [node], labelled=False)
    async with running_hub(crds, "hub-unlabelled") as hub:
        await eventually(lambda: hub.hub.tokens.synced)  # its first list would end the cached token
        assert await handshake(hub, node, tokens[node]) == 101
        assert not hub.hub.tokens.watching(node)
        assert reads(hub) == 1
        assert await handshake(hub, node, tokens[node]) == 101
        assert reads(hub) == 1


async def test_a_hub_not_allowed_to_watch_its_token_namespace_reads_each_secret(crds: ControlPlane) -> None:
    """Without list and watch rights on the namespace (only the RBAC default one has them), GETs still work."""
    node, namespace = unique("unwatched"), unique("tokens")
    await grant_secret_reads(crds, namespace)
    tokens = await register_edges(crds, [node], namespace=namespace)
    async with running_hub(crds, "hub-other-ns", token_namespace=namespace) as hub:
        assert await handshake(hub, node, tokens[node]) == 101
        assert reads(hub) == 1
        assert not hub.hub.tokens.watching(node)


async def test_a_rotated_or_deleted_token_stops_working_without_waiting_for_a_cache(crds: ControlPlane) -> None:
    """The watch replaces a rotated token and forgets a deleted one, so the old token is refused at once."""
    node = unique("rotated")
    tokens = await register_edges(crds, [node])
    name = token_secret_name(node)
    async with admin(crds) as kube, running_hub(crds, "hub-rotate") as hub:
        await eventually(lambda: hub.hub.tokens.watching(node))
        assert await handshake(hub, node, tokens[node]) == 101
        secret = await kube.get(SECRETS, name, namespace=TOKEN_NAMESPACE)
        new = {TOKEN_KEY: base64.b64encode(b"the-new-token").decode()}
        await kube.replace(SECRETS, msgspec.structs.replace(secret, data=new))
        # Before the watch, the old token stayed accepted for the 60 s its check was cached.
        await refused_within(10, hub, node, tokens[node])
        assert await handshake(hub, node, "the-new-token") == 101
        await kube.delete(SECRETS, name, namespace=TOKEN_NAMESPACE)
        await refused_within(10, hub, node, "the-new-token")


async def test_a_token_cached_from_a_read_ends_when_the_watch_sees_its_secret_change(crds: ControlPlane) -> None:
    """A Secret read by GET, then labelled with a new token: the cached old token is refused at once."""
    node = unique("relabelled")
    tokens = await register_edges(crds, [node], labelled=False)
    name = token_secret_name(node)
    async with admin(crds) as kube, running_hub(crds, "hub-relabel") as hub:
        await eventually(lambda: hub.hub.tokens.synced)
        assert await handshake(hub, node, tokens[node]) == 101  # read, and cached for a minute
        secret = await kube.get(SECRETS, name, namespace=TOKEN_NAMESPACE)
        meta = msgspec.structs.replace(secret.metadata, labels={TOKEN_LABEL: ""})
        new = {TOKEN_KEY: base64.b64encode(b"the-new-token").decode()}
        await kube.replace(SECRETS, msgspec.structs.replace(secret, metadata=meta, data=new))
        await eventually(lambda: hub.hub.tokens.watching(node))
        assert await handshake(hub, node, tokens[node]) == 403
        assert await handshake(hub, node, "the-new-token") == 101
