"""An edge installed as an operator would: ``token create`` on the cloud side, ``edge join`` on the device,
the agent started exactly as the written systemd unit starts it, reaching a real hub over TLS.

(No systemd here: the test runs the unit's ``ExecStart`` in its ``WorkingDirectory``, as systemd would.)
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

from roles.cli.join_layout import Layout
from roles.common.tls import generate_serving_certificate
from roles.kube import Kube
from roles.kube.resources import NODES, SECRETS
from schemas.core import AGENT_VERSION_ANNOTATION, EDGE_ROLE_LABEL, HUB_ANNOTATION, Node, NodeCondition, NodeStatus
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin
from tests.integration.objects import unique
from tests.integration.processes import RoleProcess
from tools.processes import terminate

pytestmark = [pytest.mark.integration, pytest.mark.slow(75)]

REPO = Path(__file__).resolve().parents[2]


def _this_checkout() -> dict[str, str]:
    """The environment of a process that must run this checkout's code from another directory."""
    return {**os.environ, "PYTHONPATH": str(REPO)}


async def _nodetaskd(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "roles.cli", *args]
    return await anyio.run_process(command, cwd=cwd, check=False, env=_this_checkout())


def _unit_command(unit: str) -> tuple[list[str], Path]:
    """The unit's ExecStart (split as systemd splits it) and WorkingDirectory."""
    fields = dict(
        line.split("=", 1) for line in unit.splitlines() if line.startswith(("ExecStart=", "WorkingDirectory="))
    )
    return shlex.split(fields["ExecStart"]), Path(fields["WorkingDirectory"])


async def _wait_for(check: object, limit_s: float = 60) -> None:
    assert callable(check)
    with anyio.fail_after(limit_s):
        while True:
            if await check():
                return
            await anyio.sleep(0.2)


@pytest.fixture
def device() -> Iterator[Path]:
    """The device's directory, with a short path: the agent's control socket under it must fit in 107 bytes, and
    pytest's tmp_path (longer still under a parallel run's worker) may not."""
    root = Path(tempfile.mkdtemp(prefix="ntd-join-", dir="/tmp"))
    try:
        (root / "device").mkdir()
        yield root / "device"
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_token_create_then_edge_join_brings_a_real_agent_to_a_real_hub(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path, device: Path
) -> None:
    """The token Secret is created (its file never overwritten unforced), the join's files start the agent, which
    makes its data directory 0700, the hub marks the Node, `edge status` shows its session, and reset undoes
    the join."""
    node, hub_id = unique("joined"), unique("hub")
    async with admin(crds) as kube:
        ready = NodeStatus(conditions=(NodeCondition(type="Ready", status="True", reason="Test", message="test"),))
        await kube.create(NODES, Node(metadata=ObjectMeta(name=node, labels={EDGE_ROLE_LABEL: ""}), status=ready))

    cert = generate_serving_certificate(tmp_path / "hub-tls", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    ca_file = tmp_path / "hub-tls" / "ca.crt"
    ports_file = tmp_path / "hub.ports.json"
    hub_config = {
        "kubeconfig": str(crds.kubeconfig("cloud")),
        "hubId": hub_id,
        "listen": "127.0.0.1:0",
        "httpListen": "127.0.0.1:0",
        "portsFile": str(ports_file),
        "tlsCertFile": str(cert.cert_file),
        "tlsKeyFile": str(cert.key_file),
        "heartbeatInterval": 1,
    }
    (tmp_path / "hub.yaml").write_bytes(msgspec.yaml.encode(hub_config))
    hub = RoleProcess("hub", tmp_path / "hub.yaml", "cloud", tmp_path / "hub.log")
    operator = tmp_path / "operator"
    operator.mkdir()
    root = device / "root"
    admin_kubeconfig = f"--kubeconfig={crds.kubeconfig('admin')}"
    await hub.start()
    launcher: anyio.abc.Process | None = None
    try:
        bound = await hub.reported_ports(ports_file)
        port, http_port = bound["listen"], bound["httpListen"]
        # The cloud side: the token Secret, and the line to run on the device.
        created = await _nodetaskd(
            "token",
            "create",
            node,
            admin_kubeconfig,
            f"--hub=wss://127.0.0.1:{port}",
            f"--ca-file={ca_file}",
            cwd=operator,
        )
        assert created.returncode == 0, created.stderr
        output = created.stdout.decode()
        assert f"created Secret kube-system/nodetaskd-edge-{node}" in output
        secret = await cloud_kube.get(SECRETS, f"nodetaskd-edge-{node}", namespace="kube-system")
        assert "nodetask.kubeedge.io/edge-token" in secret.metadata.labels
        (join_line,) = [line.strip() for line in output.splitlines() if line.strip().startswith("nodetaskd edge join")]

        # Asked again, it keeps the token file unless forced, and then the file holds the rotated token.
        first = (operator / f"{node}.token").read_bytes()
        again = await _nodetaskd("token", "create", node, admin_kubeconfig, cwd=operator)
        assert again.returncode == 2
        assert b"exists: give --force to overwrite it" in again.stderr
        assert (operator / f"{node}.token").read_bytes() == first
        unchanged = await cloud_kube.get(SECRETS, f"nodetaskd-edge-{node}", namespace="kube-system")
        assert unchanged.data == secret.data  # refused before the API server was asked
        forced = await _nodetaskd("token", "create", node, admin_kubeconfig, "--force", cwd=operator)
        assert forced.returncode == 0, forced.stderr
        assert b"rotated the token" in forced.stdout
        rotated = await cloud_kube.get(SECRETS, f"nodetaskd-edge-{node}", namespace="kube-system")
        assert base64.b64decode(rotated.data["token"]) + b"\n" == (operator / f"{node}.token").read_bytes() != first

        # The device: the token file carried over, and the printed line run there (into a temporary root).
        (device / f"{node}.token").write_bytes((operator / f"{node}.token").read_bytes())
        argv = shlex.split(join_line)[1:]

        # Join asks the hub first: the token of before the rotation, or another CA, is refused naming it, and
        # nothing is written.
        (device / "old.token").write_bytes(first)
        stale = await _nodetaskd(*argv, "--token-file=old.token", f"--root={root}", cwd=device)
        assert stale.returncode == 2, stale.stderr
        assert f"refused the token for node {node} (403".encode() in stale.stderr, stale.stderr
        other = generate_serving_certificate(tmp_path / "other-tls", dns_names=["localhost"])
        foreign = await _nodetaskd(*argv, f"--ca-file={other.ca_file}", f"--root={root}", cwd=device)
        assert foreign.returncode == 2, foreign.stderr
        assert b"its certificate does not verify against the CA" in foreign.stderr, foreign.stderr
        assert not root.exists()

        joined = await _nodetaskd(*argv, f"--root={root}", cwd=device)
        assert joined.returncode == 0, joined.stderr
        assert f"hub wss://127.0.0.1:{port}: certificate verified, token accepted".encode() in joined.stdout
        layout = Layout(root)
        command, workdir = _unit_command(layout.unit.read_text())
        assert command[-2:] == ["--config", str(layout.config)]
        assert workdir == layout.data_dir

        # The agent, started as the unit starts it, on a data directory someone opened to others: it
        # makes it its own again.
        layout.data_dir.chmod(0o755)
        with (tmp_path / "agent.log").open("wb") as log:
            launcher = await anyio.open_process(
                command, cwd=workdir, env=_this_checkout(), stdout=log, stderr=subprocess.STDOUT
            )

        async def marked() -> bool:
            assert launcher is not None
            assert launcher.returncode is None, (tmp_path / "agent.log").read_text()
            annotations = (await cloud_kube.get(NODES, node)).metadata.annotations
            return annotations.get(HUB_ANNOTATION) == hub_id and bool(annotations.get(AGENT_VERSION_ANNOTATION))

        await _wait_for(marked)
        assert stat.S_IMODE(layout.data_dir.stat().st_mode) == 0o700
        listed = await _nodetaskd("ctl", "nodes", "-o", "json", admin_kubeconfig, cwd=operator)
        (row,) = [r for r in json.loads(listed.stdout) if r["name"] == node]
        assert (row["connected"], row["hub"]) == (True, hub_id)

        # On the device, the agent says how it stands; with it stopped, the status fails in one line.
        shown = await _nodetaskd("edge", "status", f"--config={layout.config}", cwd=device)
        assert shown.returncode == 0, shown.stderr
        lines = dict(line.split(":", 1) for line in shown.stdout.decode().splitlines())
        assert lines["Node"].strip() == node
        assert lines["Hub"].strip().startswith(f"{hub_id}, connected (1 sessions"), lines
        assert lines["Tasks"].strip() == "running 0, waiting_confirmation 0, finished 0"
        as_json = json.loads(
            (await _nodetaskd("edge", "status", f"--config={layout.config}", "-o", "json", cwd=device)).stdout
        )
        assert (as_json["connected"], as_json["observed"]["sessions"]) == ("true", 1)

        # Reset refuses while the agent runs, then undoes the join once it is stopped.
        refused = await _nodetaskd("edge", "reset", f"--root={root}", cwd=device)
        assert refused.returncode == 1
        assert b"is running" in refused.stderr
        assert await terminate(launcher) == 0
        gone = await _nodetaskd("edge", "status", f"--config={layout.config}", cwd=device)
        assert gone.returncode == 3, gone
        assert gone.stderr.decode().count("\n") == 1, gone.stderr
        assert b"cannot reach the edge agent at" in gone.stderr, gone.stderr
        reset = await _nodetaskd("edge", "reset", f"--root={root}", cwd=device)
        assert reset.returncode == 0, reset.stderr
        assert list(root.iterdir()) == []
    finally:
        if launcher is not None:
            await terminate(launcher)
        await hub.stop()
    assert _health(http_port) == 0  # the hub is gone too


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
            return int(answer.status)
    except OSError:
        return 0
