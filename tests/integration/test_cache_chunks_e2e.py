"""A collection larger than an edge's frame, relisted after a reconnect: the controller, a hub and an agent
with its local API as real processes, as in ``test_autonomy_e2e``."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Final

import msgspec
import pytest

from roles.cloud.cache.streams import FRAME_LIMIT
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import kubectl, polled, unique
from tests.integration.processes import fleet
from tests.integration.test_autonomy_e2e import NS, Device, apply, config_map_doc, local_api, pod_doc
from tools.ports import free_port

pytestmark = pytest.mark.integration

PODS: Final = 7
ANNOTATION_BYTES: Final = 200 * 1024
"""Each Pod carries this much (under the API server's 256 KiB for a Pod's annotations): six are over the frame."""


async def test_a_pod_deleted_while_the_edge_was_away_leaves_its_cache_though_its_pods_exceed_a_frame(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """An agent caches its node's Pods, more than one frame holds; with its hub stopped, one Pod is deleted;
    once the hub is back, the relist in chunks replaces the collection and the device no longer has it,
    while it still has the others."""
    cp = crds
    cp.kubectl("create", "serviceaccount", "default", "-n", NS, check=False)
    port = free_port()
    device = Device(port=port, kubectl_path=cp.binaries.kubectl, home=tmp_path / "device")
    device.home.mkdir()
    options = functools.partial(local_api, port, serve_secrets=False)
    async with fleet(cp, tmp_path, edges=1, hubs=1, edge_options=lambda _: options()) as running:
        (node,) = running.edges
        conf = unique("conf")
        pods = sorted(unique("big") for _ in range(PODS))
        filled = {"filler": "x" * ANNOTATION_BYTES}
        docs = [pod_doc(name, node, config_map=conf, annotations=filled) for name in pods]
        assert len(msgspec.json.encode(docs[1:])) > FRAME_LIMIT, "what is left once one is deleted is over a frame"
        # Created, not applied: kubectl apply would copy each Pod into an annotation, over the limit.
        await apply(cp, config_map_doc(conf, "one"), *docs, verb="create")
        paths = [f"/api/v1/namespaces/{NS}/pods/{name}" for name in pods]

        async def on_device() -> list[int]:
            return [(await device.read(path))[0] for path in paths]

        await polled(on_device, lambda codes: codes == [200] * PODS, limit_s=60)

        hub = running.hubs[0]
        await hub.stop()
        await kubectl(cp, "delete", "pod", "-n", NS, pods[0], "--grace-period=0", "--force")
        await hub.start()

        await polled(on_device, lambda codes: codes == [404] + [200] * (PODS - 1), limit_s=60)
        assert "cache_collection_chunked" in hub.log.read_text()
