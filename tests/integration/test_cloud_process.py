"""``nodetaskd --role=cloud`` as a real process: TLS, readiness, and a clean SIGTERM."""

from __future__ import annotations

import functools
import signal
import ssl
import subprocess
from pathlib import Path

import anyio
import msgspec
import pytest

from roles.common.tls import generate_serving_certificate
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import eventually, light_edge, running_edges
from tests.integration.objects import unique
from tools.processes import NotReady, answers_ok, role_command, until_ports

pytestmark = pytest.mark.integration


async def test_cloud_process_on_port_0_reports_its_ports_serves_wss_there_and_exits_cleanly_on_sigterm(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """The hub process, told to listen on port 0, writes the ports it bound to its portsFile and serves edges over
    TLS and /readyz on them; on SIGTERM it sends 1001, removes the file and exits 0."""
    node = unique("proc")
    tokens = await register_edges(crds, [node])
    cert = generate_serving_certificate(tmp_path / "tls", dns_names=["localhost"])
    ports_file, log = tmp_path / "hub.ports.json", tmp_path / "hub.log"
    config = {
        "kubeconfig": str(crds.kubeconfig("cloud")),
        "hubId": "hub-process",
        "listen": "127.0.0.1:0",
        "httpListen": "127.0.0.1:0",
        "portsFile": str(ports_file),
        "tlsCertFile": str(cert.cert_file),
        "tlsKeyFile": str(cert.key_file),
        "heartbeatInterval": 1,
    }
    (tmp_path / "cloud.yaml").write_bytes(msgspec.yaml.encode(config))
    client = ssl.create_default_context(cadata=cert.ca_bundle.decode())
    command = role_command("cloudhub", tmp_path / "cloud.yaml")
    with log.open("wb") as out:
        process = await anyio.open_process(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        try:
            bound = await until_ports(process, ports_file, limit_s=30)
        except NotReady as exc:
            raise AssertionError(f"the hub {exc}: {log.read_text()}") from None
        ws_port, http_port = bound["listen"], bound["httpListen"]
        assert 0 not in (ws_port, http_port)
        (said,) = [line.split() for line in log.read_text().splitlines() if "hub_listening" in line]
        assert {f"listen=127.0.0.1:{ws_port}", f"http_listen=127.0.0.1:{http_port}"} <= set(said)
        ready = functools.partial(answers_ok, f"https://127.0.0.1:{http_port}/readyz", context=client)
        assert await anyio.to_thread.run_sync(ready)
        edge = light_edge(node, f"wss://127.0.0.1:{ws_port}", tokens[node], ssl_context=client, reconnect_delay=60)
        async with running_edges([edge]):
            await eventually(lambda: edge.connects == 1)
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
    assert not ports_file.exists()
