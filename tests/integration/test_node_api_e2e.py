"""The node's API endpoint end to end: kubectl on the device, through the agent and a hub, as the node.

The controller, a hub relaying (``apiRelay``) and an agent with ``nodeApi`` run as processes against
the real API server with its Node authorizer and NodeRestriction; the node's certificate comes as it
does in production: the agent asks its hub, which asks the CSR API, the controller approves, the
controller manager signs. Every answer is the API server's own: what the
node may do it does, what it may not gets the API server's 403.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integration.controlplane import ControlPlane
from tests.integration.objects import kubectl, polled, unique
from tests.integration.processes import fleet
from tools.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow(60)]
NS = "default"


@dataclass(frozen=True)
class Device:
    """kubectl on the device, pointed at the node's API endpoint with no credentials of its own."""

    port: int
    kubectl_path: Path
    home: Path

    async def kubectl(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        argv = [str(self.kubectl_path), f"--server=http://127.0.0.1:{self.port}", f"--cache-dir={self.home}/kc", *args]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home), "KUBECONFIG": str(self.home / "none")}
        with anyio.fail_after(60):
            return await anyio.run_process(argv, check=False, env=env, input=stdin)

    async def json(self, *args: str) -> Any:
        result = await self.kubectl(*args, "-o", "json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


async def test_kubectl_through_the_device_is_the_node_online_and_reads_its_cache_offline(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """Through the agent and a relaying hub the device gets its Node and may write its own Lease; the API
    server refuses it a Secret no pod of the node references and a patch of another Node (403, its own
    words); with the hub stopped the Node it read comes from the cache and a lease renewal is answered
    with the cached Lease; with the hub back, requests reach the API server again."""
    cp = crds
    port = free_port()
    credentials = tmp_path / "node-credentials"
    device = Device(port=port, kubectl_path=cp.binaries.kubectl, home=tmp_path / "device")
    device.home.mkdir()

    def node_api(i: int) -> dict[str, object]:
        if i:
            return {}  # the other node runs no kubelet here: it is only the Node the device may not write
        return {
            "nodeApi": {"enabled": True, "port": port, "credentialsDir": str(credentials), "serverName": "127.0.0.1"}
        }

    async with fleet(
        cp, tmp_path, edges=2, hubs=1, hub_options={"apiRelay": {"enabled": True}}, edge_options=node_api
    ) as running:
        node, other = list(running.edges)
        secret = unique("unreferenced")
        await kubectl(cp, "create", "secret", "generic", secret, "-n", NS, "--from-literal=k=v")

        async def got_node() -> subprocess.CompletedProcess[bytes]:
            return await device.kubectl("get", "node", node, "-o", "json")

        found = await polled(got_node, lambda result: result.returncode == 0, limit_s=90)
        assert json.loads(found.stdout)["metadata"]["name"] == node

        refused = await device.kubectl("get", "secret", "-n", NS, secret)
        assert refused.returncode != 0
        assert b"Forbidden" in refused.stderr
        assert f"system:node:{node}".encode() in refused.stderr
        refused = await device.kubectl("label", "node", other, "stolen=yes")
        assert refused.returncode != 0
        assert b"Forbidden" in refused.stderr or b"forbidden" in refused.stderr

        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40},
        }
        created = await device.kubectl("create", "-f", "-", stdin=json.dumps(lease).encode())
        assert created.returncode == 0, created.stderr
        online = await device.json("get", "lease", "-n", "kube-node-lease", node)
        assert online["spec"]["holderIdentity"] == node

        hub = running.hubs[0]
        await hub.kill()
        cached = await device.json("get", "node", node)
        assert cached["metadata"]["name"] == node
        renewal = {**online, "spec": {**online["spec"], "leaseDurationSeconds": 99}}
        renewed = await device.kubectl(
            "replace", "--validate=false", "-f", "-", "-o", "json", stdin=json.dumps(renewal).encode()
        )
        assert renewed.returncode == 0, renewed.stderr
        assert json.loads(renewed.stdout)["spec"]["leaseDurationSeconds"] == 40  # the cached Lease, unchanged

        await hub.start()
        await hub.until_ready()

        async def renewed_online() -> subprocess.CompletedProcess[bytes]:
            return await device.kubectl(
                "replace", "--validate=false", "-f", "-", "-o", "json", stdin=json.dumps(renewal).encode()
            )

        def applied(result: subprocess.CompletedProcess[bytes]) -> bool:
            return result.returncode == 0 and json.loads(result.stdout)["spec"]["leaseDurationSeconds"] == 99

        # The replace carries the resource version read online: once the relay is back it is the API server's.
        await polled(renewed_online, applied, limit_s=90)
