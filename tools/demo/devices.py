"""The demo's real nodes: devices whose stock kubelet's only API server is their edge agent, and a cloud node.

Each device is a containerd and a kubelet of its own (``tools/provision/node.py``) beside an edge agent
with ``nodeApi`` on: the kubelet's kubeconfig names the agent's loopback endpoint and holds no
credentials; the agent gets the node's certificate through its hub (``apiRelay``) and the CSR API, and
relays the kubelet's requests, or answers them from its cache while no hub is there. The kubelet
registers its own Node (so the demo registers only the device's token: kubelet 1.20 panics taking
over a Node made without its capacity). Each device runs a web pod whose page is a ConfigMap.

The cloud node is a kubelet speaking to the API server directly, as a cloud machine's does. It is what
keeps the cluster out of the node lifecycle controller's "every node is down" mode, in which it evicts
nothing: the agent-only edges' Nodes have no kubelet and go NotReady soon after the demo starts, and
every hub is stopped in :mod:`tools.demo.devices_scene`. For the same reason the devices are in a zone of
their own: in a zone where most of a small cluster's Nodes are down, nothing is evicted either.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from nodetask.autonomy import AUTONOMY_ANNOTATION, BINDABLE_LABEL, DURATION_ANNOTATION
from tools.demo import heartbeat
from tools.demo.fleet import Edge, Hub
from tools.provision import controlplane as _cp
from tools.provision import node_images
from tools.provision.cluster_start import NodeMonitor
from tools.provision.node import Node, NodeTools, ensure_node_tools, start_node, web_pod
from tools.provision.pki import plain_kubeconfig

T = TypeVar("T")
NAMES: Final = ("device-01", "device-02")
"""The first asks for autonomy, the second's pod tolerates an outage for :data:`SHORT_TOLERATION_S`; the second's
kubelet runs supervised, and is upgraded (:mod:`tools.demo.kubelet_scene`)."""
CLOUD_NODE: Final = "cloud-01"
NAMESPACE: Final = "demo-devices"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
AUTONOMY_DURATION: Final = "0"
"""For ever, as ``node.beta.openyurt.io/autonomy: "true"`` says too (that annotation alone binds no pod)."""
SHORT_TOLERATION_S: Final = 10
NODE_MONITOR: Final = NodeMonitor(period_s=2, grace_period_s=20)
"""The demo's node lifecycle controller: a Node silent for 20 s is NotReady (production: 40 s), looked at every
2 s, so the cloud's side of the outage shows without a long wait. The devices' kubelets renew their Leases
every 3 s (:data:`KUBELET_SETTINGS`), the agent-only edges' the demo does (:mod:`tools.demo.heartbeat`)."""
KUBELET_SETTINGS: Final[Mapping[str, object]] = {"nodeLeaseDurationSeconds": heartbeat.DURATION_S}
"""The agent-only edges' Lease duration: a kubelet renews every quarter of it, 3 s, well within the demo's grace
even while a kubelet upgrade restarts one (production: 40 s, renewed every 10 s, for 40 s of grace)."""
KUBELET_ARGS: Final = ("--sync-frequency=10s",)
"""How often the kubelet looks at its pods again, so that a ConfigMap's change reaches their volumes in
seconds (its default, one minute, would be most of the demo's wait)."""
UNREACHABLE_KEYS: Final = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
LIMIT_S: Final = 120.0


def pod_name(device: str) -> str:
    return f"web-{device}"


def page_name(device: str) -> str:
    return f"page-{device}"


def page(device: str) -> str:
    return f"served by {device}\n"


NEW_PAGE: Final = "changed in the cloud while every hub was down\n"


@dataclass
class DevicesView:
    """What the real nodes showed (empty fields: not reached; ``problem``: why they did not run)."""

    problem: str = ""
    served: dict[str, str] = field(default_factory=dict)
    """Device to what its pod answered once its Node was Ready."""
    tolerations: dict[str, int | None] = field(default_factory=dict)
    """Device to its pod's ``unreachable`` toleration seconds (None: for ever) before the outage."""
    offline: dict[str, str] = field(default_factory=dict)
    """Device to what its pod answered with every hub stopped."""
    not_ready: dict[str, str] = field(default_factory=dict)
    """Device to its Node's Ready condition in the cloud during the outage."""
    evicted: str = ""
    kept: str = ""
    restarted: str = ""
    """What the restarted device's new container answered while the cloud was still gone."""
    ready_again: list[str] = field(default_factory=list)
    new_page: str = ""
    """What the autonomy device's pod answered once the hubs were back (its ConfigMap changed meanwhile)."""
    kubelet: dict[str, Any] = field(default_factory=dict)
    """The kubelet upgrade (:mod:`tools.demo.kubelet_scene`): its job, outcome, versions and the Nodes before
    and after, as ``kubectl get nodes -o wide`` shows them."""

    def as_json(self) -> dict[str, Any]:
        return {
            "problem": self.problem,
            "served": self.served,
            "tolerations": self.tolerations,
            "offline": self.offline,
            "notReady": self.not_ready,
            "evicted": self.evicted,
            "kept": self.kept,
            "restarted": self.restarted,
            "readyAgain": self.ready_again,
            "newPage": self.new_page,
            "kubeletUpgrade": self.kubelet,
        }

    def lines(self) -> list[str]:
        if self.problem:
            return [f"real nodes: NOT RUN: {self.problem}"]
        out = [f"real nodes: {', '.join(NAMES)} (kubelets behind their agents), {CLOUD_NODE} (to the API server)"]
        out += [f"  {d}: Ready, its pod answered {text!r}" for d, text in self.served.items()]
        out += [f"  {d}: its pod tolerates unreachable for {_seconds(s)}" for d, s in self.tolerations.items()]
        out += [f"  every hub stopped: {d}'s pod answered {text!r}" for d, text in self.offline.items()]
        out += [f"  {d}: Ready {status} in the cloud" for d, status in self.not_ready.items()]
        if self.evicted:
            out.append(f"  {self.evicted}: evicted in the cloud; {self.kept}: kept (its Node asks for autonomy)")
        if self.restarted:
            out.append(f"  {NAMES[0]} restarted whole with the cloud gone: its pod answered {self.restarted!r}")
        if self.ready_again:
            out.append(f"  hubs back: {', '.join(self.ready_again)} Ready")
        if self.new_page:
            out.append(f"  {NAMES[0]}'s pod answers its ConfigMap as changed meanwhile: {self.new_page!r}")
        return out + _kubelet_lines(self.kubelet)


def _kubelet_lines(kubelet: dict[str, Any]) -> list[str]:
    if not kubelet:
        return []
    if kubelet.get("problem"):
        return [f"  kubelet upgrade: NOT RUN: {kubelet['problem']}"]
    kept = "the same container ran throughout" if kubelet.get("podKept") else "ITS POD'S CONTAINER CHANGED"
    out = [
        f"  kubelet upgrade {kubelet['job']} of {kubelet['node']} ({kubelet['from']} to {kubelet['to']}, confirmed"
        f" with nodetaskd ctl confirm): {kubelet['phase']} in {kubelet['seconds']:.0f} s; {kept}"
    ]
    if kubelet.get("reason"):
        out.append(f"    reason: {kubelet['reason']}")
    for when in ("before", "after"):
        out.append(f"    kubectl get nodes -o wide, {when}:")
        out += [f"      {line}" for line in kubelet.get(when, "").splitlines()]
    return out


def _seconds(value: int | None) -> str:
    return "ever" if value is None else f"{value} s"


@dataclass
class Devices:
    """The real nodes of one run, their bring-up (in a thread of its own, beside the jobs) and what it saw."""

    cp: _cp.ControlPlane
    root: Path
    """The directory the nodes' state goes in."""
    edges: list[Edge]
    say: Callable[[str, str], None]
    view: DevicesView = field(default_factory=DevicesView)
    nodes: dict[str, Node] = field(default_factory=dict)
    restarted_ip: str = ""
    """The restarted device's pod IP, read on the device (the cloud learns it once a hub is back)."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._bring_up, name="devices", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the bring-up; whether it is over."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def stop(self) -> list[str]:
        """Cancel the bring-up and stop every node; problems met."""
        self.cancelled.set()
        self.join(120)
        problems = []
        for node in list(self.nodes.values()):
            try:
                node.stop()
            except _cp.ControlPlaneError as exc:
                problems.append(str(exc))
        return problems

    def _bring_up(self) -> None:
        try:
            self._run()
        except (_cp.ControlPlaneError, subprocess.CalledProcessError, TimeoutError, OSError) as exc:
            self.view.problem = " ".join(str(exc).split())[:400]
            self.say(f"REAL NODES FAILED: {self.view.problem}", "bold yellow")

    def _run(self) -> None:
        cp = self.cp
        tools = ensure_node_tools()
        cp.kubectl("create", "namespace", NAMESPACE)
        cp.kubectl("label", "namespace", NAMESPACE, f"{BINDABLE_LABEL}=true")
        starts: dict[str, tuple[Path, str]] = {CLOUD_NODE: (cp.node_kubeconfig(CLOUD_NODE, self.root / "pki"), "cloud")}
        healthz = {edge.name: edge.kubelet_healthz_port for edge in self.edges}
        for edge in self.edges:
            kubeconfig = self.root / f"{edge.name}.kubeconfig"
            kubeconfig.write_text(plain_kubeconfig(f"http://127.0.0.1:{edge.node_api_port}"))
            starts[edge.name] = (kubeconfig, "edge-site")
            literal = f"--from-literal=index.html={page(edge.name)}"
            cp.kubectl("create", "configmap", page_name(edge.name), "-n", NAMESPACE, literal)
        self.say(f"real nodes: starting {', '.join(starts)} ({CLOUD_NODE}'s kubelet speaks to the API server)", "")
        with concurrent.futures.ThreadPoolExecutor(len(starts)) as pool:
            for started in [
                pool.submit(self._start, n, k, tools, zone=z, healthz_port=healthz.get(n, 0))
                for n, (k, z) in starts.items()
            ]:
                started.result()
        for name in (CLOUD_NODE, *NAMES):
            self._until(f"{name}'s Node Ready", lambda n=name: ready(cp, n))  # type: ignore[misc]
        autonomous, other = NAMES
        asks = {AUTONOMY_ANNOTATION: "true", DURATION_ANNOTATION: AUTONOMY_DURATION}
        body = json.dumps({"metadata": {"annotations": asks}})
        cp.kubectl("patch", "node", autonomous, "--type=merge", "-p", body)
        for name in NAMES:
            pod = web_pod(pod_name(name), name, page_configmap=page_name(name))
            if name == other:
                pod["spec"]["tolerations"] = [
                    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": SHORT_TOLERATION_S}
                    for key in UNREACHABLE_KEYS
                ]
            cp.kubectl("create", "-n", NAMESPACE, "-f", "-", input=json.dumps(pod))
        self.say(
            f"real nodes: {', '.join(NAMES)} registered their Nodes through their agents; {autonomous} asks for "
            f"autonomy (its pods bound to tolerate its outage for ever), {other}'s pod tolerates an outage for "
            f"{SHORT_TOLERATION_S} s",
            "",
        )
        for name in NAMES:
            answered = self._until(f"{name}'s pod answering", lambda n=name: serving(cp, n))  # type: ignore[misc]
            self.view.served[name] = answered
        self._until(f"{autonomous}'s pod bound to its autonomy", lambda: bound(cp, autonomous))
        self.view.tolerations = {name: toleration(cp, name)[1] for name in NAMES}
        self.say(
            "real nodes Ready, pods answering: "
            + "; ".join(f"{d}: {text.strip()!r}" for d, text in self.view.served.items()),
            "",
        )

    def _start(self, name: str, kubeconfig: Path, tools: NodeTools, *, zone: str, healthz_port: int) -> None:
        if self.cancelled.is_set():
            raise _cp.ControlPlaneError("cancelled")
        node = start_node(
            self.root / name,
            name,
            kubeconfig,
            tools,
            labels={ZONE_LABEL: zone},
            kubelet_args=KUBELET_ARGS,
            kubelet_settings=KUBELET_SETTINGS,
            supervised=bool(healthz_port),
            healthz_port=healthz_port,
        )
        with self._lock:
            self.nodes[name] = node

    def _until(self, what: str, probe: Callable[[], T | None]) -> T:
        deadline = time.monotonic() + LIMIT_S
        while (value := probe()) is None:
            if self.cancelled.is_set():
                raise _cp.ControlPlaneError("cancelled")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what}: not after {LIMIT_S:g} s")
            time.sleep(0.5)
        return value


def plan_devices(hubs: list[Hub], ports: list[int], kubelet_healthz_port: int) -> list[Edge]:
    """The devices' agents: each lists every hub (its primary first) and runs ``nodeApi`` on its port; the
    second's kubelet is supervised, its healthz on ``kubelet_healthz_port``."""
    return [
        Edge(
            name=name,
            ring="device",
            hubs=(hubs[i % len(hubs)], *(h for h in hubs if h is not hubs[i % len(hubs)])),
            full_disk=False,
            node_api_port=port,
            kubelet_healthz_port=kubelet_healthz_port if name == NAMES[1] else 0,
        )
        for i, (name, port) in enumerate(zip(NAMES, ports, strict=True))
    ]


def get(cp: _cp.ControlPlane, *args: str) -> dict[str, Any] | None:
    result = cp.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def ready_status(cp: _cp.ControlPlane, name: str) -> str:
    """The Node's Ready condition's status (empty: no Node or no condition)."""
    node = get(cp, "node", name)
    conditions = node["status"].get("conditions", []) if node else []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


def ready(cp: _cp.ControlPlane, name: str) -> bool | None:
    return True if ready_status(cp, name) == "True" else None


def pod(cp: _cp.ControlPlane, device: str) -> dict[str, Any] | None:
    return get(cp, "pod", "-n", NAMESPACE, pod_name(device))


def answer(ip: str) -> str | None:
    """What the web server at ``ip`` answers, or None."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{node_images.WEB_PORT}/", timeout=2) as got:
            return str(got.read().decode())
    except OSError:
        return None


def serving(cp: _cp.ControlPlane, device: str) -> str | None:
    """What the device's pod answers at the pod IP the cloud knows, once it runs."""
    found = pod(cp, device)
    ip = (found or {}).get("status", {}).get("podIP")
    return answer(ip) if ip and found and found["status"].get("phase") == "Running" else None


def toleration(cp: _cp.ControlPlane, device: str) -> tuple[bool, int | None]:
    """Whether the device's pod tolerates its Node unreachable, and for how long (None: for ever)."""
    found = pod(cp, device) or {}
    for item in found.get("spec", {}).get("tolerations", []):
        if item.get("key") == UNREACHABLE_KEYS[0]:
            seconds = item.get("tolerationSeconds")
            return True, None if seconds is None else int(seconds)
    return False, None


def bound(cp: _cp.ControlPlane, device: str) -> bool | None:
    """The device's pod tolerates its Node unreachable for ever (the controller bound it to its autonomy)."""
    return True if toleration(cp, device) == (True, None) else None


def pod_ip(pid: int) -> str | None:
    """The IPv4 address of the network namespace process ``pid`` is in (its pod's IP), read on the device."""
    result = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "ip", "-4", "-o", "addr", "show", "eth0"],
        capture_output=True,
        text=True,
        check=False,
    )
    fields = result.stdout.split()
    return fields[fields.index("inet") + 1].partition("/")[0] if "inet" in fields else None


def restarted_pod(node: Node, before: dict[str, int]) -> tuple[str, str] | None:
    """The restarted pod's IP and what it answers, once a container the node did not run ``before`` serves."""
    for container, pid in node.tasks().items():
        if container in before:
            continue
        ip = pod_ip(pid)
        text = answer(ip) if ip else None
        if ip and text is not None:
            return ip, text
    return None
