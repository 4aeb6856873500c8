"""``nodetaskd --role=cloud`` as a real process: TLS, readiness, and a clean SIGTERM."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import anyio
import msgspec
import pytest

from roles.tls import generate_serving_certificate
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import eventually, free_port, light_edge, running_edges
from tests.integration.objects import unique

pytestmark = pytest.mark.integration


def _ready(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


async def test_cloud_process_serves_wss_and_exits_cleanly_on_sigterm(crds: ControlPlane, tmp_path: Path) -> None:
    """The hub process serves edges over TLS, reports ready, and on SIGTERM sends 1001 and exits 0."""
    node = unique("proc")
    tokens = await register_edges(crds, [node])
    cert = generate_serving_certificate(tmp_path / "tls", dns_names=["localhost"])
    ws_port, http_port = free_port(), free_port()
    config = {
        "kubeconfig": str(crds.kubeconfig("cloud")),
        "hubId": "hub-process",
        "listen": f"127.0.0.1:{ws_port}",
        "httpListen": f"127.0.0.1:{http_port}",
        "tlsCertFile": str(cert.cert_file),
        "tlsKeyFile": str(cert.key_file),
        "heartbeatInterval": 1,
    }
    (tmp_path / "cloud.yaml").write_bytes(msgspec.yaml.encode(config))
    client = ssl.create_default_context(cadata=cert.ca_bundle.decode())
    command = [sys.executable, "-m", "roles.cli", "--role=cloudhub", f"--config={tmp_path / 'cloud.yaml'}"]
    process = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with anyio.fail_after(30):
            while True:
                if await anyio.to_thread.run_sync(_ready, f"https://127.0.0.1:{http_port}/readyz", client):
                    break
                await anyio.sleep(0.2)
        edge = light_edge(node, f"wss://127.0.0.1:{ws_port}", tokens[node], ssl_context=client, reconnect_delay=60)
        async with running_edges([edge]):
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(15):
                code = await process.wait()
            await eventually(lambda: edge.close_codes)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0
    assert edge.close_codes == [1001]
    assert edge.connects == 1
