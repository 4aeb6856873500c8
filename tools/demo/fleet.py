"""The demo's fleet: where each process keeps its files, and the YAML config of each role.

Everything lives under one state directory, so a run is inspectable afterwards and the next run
can wipe it whole::

    <state>/cluster/            kube-apiserver + etcd (tools/provision/controlplane.py), admin.kubeconfig
    <state>/runtime/            containerd and the registry (tools/provision/containerd.py), when available
    <state>/tls/hub/            the hubs' serving certificate and the CA the edges trust
    <state>/tls/controller/     the webhook certificate the controller generates (certDir)
    <state>/config/             controller.yaml, hub-a.yaml, hub-b.yaml
    <state>/run/<hub>.ports.json   the ports each hub bound (its portsFile), while it runs
    <state>/edges/<node>/       edge.yaml, token, data/ (the agent's SQLite store)
    <state>/nodes/<node>/       a real node's containerd and kubelet (tools/provision/node.py), their logs
    <state>/logs/<name>.log     stdout + stderr of every nodetaskd process
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from tools.provision.node_device import kubelet_restart_command

CANARIES: Final = 2
"""Nodes in the ``canary`` ring (the upgrade job's); the rest form the ``main`` ring."""
RING_LABEL: Final = "demo.nodetaskd.io/ring"
FULL_DISK_THRESHOLD: Final = 1.0
"""maxDiskUsage of the one node whose disk check must fail (any real disk is more than 1% used)."""
KUBELET_HEALTH_DEADLINE: Final = 60
"""Seconds an upgraded kubelet has to answer healthz and post its Node Ready before it is rolled back."""
RECONNECT_MAX_DELAY: Final = 5
"""The edges' ``reconnectMaxDelay``: once the stopped hubs are back, each edge is back within 5 s, not
production's 30 (a fleet of four has no reconnection storm to spread)."""


@dataclass(frozen=True)
class Layout:
    """Paths inside the demo's state directory."""

    root: Path

    @property
    def cluster(self) -> Path:
        return self.root / "cluster"

    @property
    def runtime(self) -> Path:
        return self.root / "runtime"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def hub_tls(self) -> Path:
        return self.root / "tls" / "hub"

    @property
    def controller_tls(self) -> Path:
        return self.root / "tls" / "controller"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def run(self) -> Path:
        return self.root / "run"

    def ports(self, hub: str) -> Path:
        """Where ``hub`` writes the ports it bound (its ``portsFile``): it starts on port 0."""
        return self.run / f"{hub}.ports.json"

    @property
    def record(self) -> Path:
        """PIDs of the processes this run started, for the next run should this one be killed."""
        return self.root / "pids"

    @property
    def nodes(self) -> Path:
        """The real nodes' state (:mod:`tools.demo.devices`)."""
        return self.root / "nodes"

    def edge(self, node: str) -> Path:
        return self.root / "edges" / node

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def no_runtime_socket(self) -> str:
        """A CRI endpoint where nothing listens: what the edges get when no containerd runs."""
        return f"unix://{self.root / 'runtime' / 'none.sock'}"


@dataclass(frozen=True)
class Hub:
    """A started hub, with the ports it reported it bound."""

    name: str
    port: int
    http_port: int

    @property
    def url(self) -> str:
        return f"wss://127.0.0.1:{self.port}"

    @property
    def ready_url(self) -> str:
        return f"https://127.0.0.1:{self.http_port}/readyz"


@dataclass(frozen=True)
class HubState:
    """A hub as the summary found it: its process, whether it answers ready, and the edges it holds."""

    name: str
    url: str
    http_port: int
    pid: int
    starts: int
    running: bool
    ready: bool
    edges: tuple[str, ...]
    """The Nodes whose hub annotation names it."""

    def line(self) -> str:
        state = "running and ready" if self.ready else "running, NOT ready" if self.running else "NOT running"
        starts = "once" if self.starts == 1 else f"{self.starts} times"
        return (
            f"{self.name}: {state} at {self.url} and https://127.0.0.1:{self.http_port} (pid {self.pid}, "
            f"started {starts}), holding {', '.join(self.edges) or 'no edge'}"
        )


@dataclass(frozen=True)
class Edge:
    name: str
    ring: str
    hubs: tuple[Hub, ...]
    """Its primary hub first: the fleet is split across the hubs, each edge falling back to the other."""
    full_disk: bool
    local_api_port: int = 0
    """The autonomy step's edge (:mod:`tools.demo.autonomy`): its local API's port; 0 for the others."""
    node_api_port: int = 0
    """A device's (:mod:`tools.demo.devices`): the port its kubelet's API endpoint listens on; 0 for the others."""
    kubelet_healthz_port: int = 0
    """A device whose kubelet runs supervised and may be upgraded (:mod:`tools.demo.kubelet_scene`): its
    kubelet's healthz port, which the agent's ``kubelet`` settings name; 0 for the others."""


def plan_edges(count: int, hubs: Sequence[Hub], *, local_api_port: int = 0) -> list[Edge]:
    """``edge-01``..: the first :data:`CANARIES` in the canary ring, the last with a full disk, the one before it
    the autonomy step's (its local API on ``local_api_port``, and its own hub only: stopping it cuts the edge off)."""
    width = max(2, len(str(count)))
    edges = []
    for i in range(count):
        primary = hubs[i % len(hubs)]
        autonomous = bool(local_api_port) and i == count - 2
        order = (primary,) if autonomous else (primary, *(h for h in hubs if h is not primary))
        edges.append(
            Edge(
                name=f"edge-{i + 1:0{width}d}",
                ring="canary" if i < CANARIES else "main",
                hubs=order,
                full_disk=i == count - 1,
                local_api_port=local_api_port if autonomous else 0,
            )
        )
    return edges


def write_yaml(path: Path, config: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.yaml.encode(config))
    return path


def edge_launcher(config: Path) -> list[str]:
    """An edge agent under its launcher, which restarts it onto an upgraded version and rolls back."""
    return [sys.executable, "-m", "roles.edge.launcher", f"--config={config}"]


def controller_config(layout: Layout, *, kubeconfig: Path, webhook_port: int, metrics_port: int) -> Path:
    return write_yaml(
        layout.config / "controller.yaml",
        {
            "kubeconfig": str(kubeconfig),
            "identity": "demo-controller",
            "listenHost": "127.0.0.1",
            "webhookPort": webhook_port,
            "webhookUrl": f"https://127.0.0.1:{webhook_port}",
            "certDir": str(layout.controller_tls),
            "metricsPort": metrics_port,
            # Silent nodes are noticed within 2 s of their deadline rather than 10.
            "timeoutSweepInterval": 2,
            # A Node's autonomy reaches its Pods' tolerations within seconds rather than a minute after the
            # controller first saw the Node (the real nodes' kubelets register theirs as the demo runs).
            "autonomyBindingInterval": 5,
        },
    )


def hub_config(
    layout: Layout, name: str, *, kubeconfig: Path, cert: Path, key: Path, port: int = 0, http_port: int = 0
) -> Path:
    """Hub ``name``'s config: on port 0 (a free port each, which it reports) unless given the ports of its last run."""
    layout.run.mkdir(parents=True, exist_ok=True)
    return write_yaml(
        layout.config / f"{name}.yaml",
        {
            "kubeconfig": str(kubeconfig),
            "hubId": name,
            "listen": f"127.0.0.1:{port}",
            "httpListen": f"127.0.0.1:{http_port}",
            "portsFile": str(layout.ports(name)),
            "tlsCertFile": str(cert),
            "tlsKeyFile": str(key),
            # The devices' kubelets reach the API server through their agents' sessions.
            "apiRelay": {"enabled": True},
        },
    )


def edge_config(
    layout: Layout,
    edge: Edge,
    *,
    token: str,
    ca_file: Path,
    cri_endpoint: str,
    loopback_ports: Sequence[int] = (),
    kubelet_image: str = "",
) -> Path:
    home = layout.edge(edge.name)
    (home / "data").mkdir(parents=True, exist_ok=True)
    token_file = home / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    config: dict[str, object] = {
        "nodeName": edge.name,
        "hubUrls": [h.url for h in edge.hubs],
        "tokenFile": str(token_file),
        "caFile": str(ca_file),
        "dataDir": str(home / "data"),
        "criEndpoint": cri_endpoint,
        "reconnectMaxDelay": RECONNECT_MAX_DELAY,
    }
    if edge.full_disk:
        config["maxDiskUsage"] = FULL_DISK_THRESHOLD
    if edge.local_api_port:
        config["localApi"] = {"enabled": True, "port": edge.local_api_port}
    if edge.node_api_port:
        config["nodeApi"] = {"enabled": True, "port": edge.node_api_port}
    if loopback_ports:
        config["diagnosis"] = {"loopbackPorts": list(loopback_ports)}
    if edge.kubelet_healthz_port:
        node = layout.nodes / edge.name
        config["kubelet"] = {
            "binary": str(node / "kubelet"),
            "restartCommand": kubelet_restart_command(node),
            "healthzUrl": f"http://127.0.0.1:{edge.kubelet_healthz_port}/healthz",
            "healthDeadline": KUBELET_HEALTH_DEADLINE,
            "upgradeImage": kubelet_image,
        }
    return write_yaml(home / "edge.yaml", config)
