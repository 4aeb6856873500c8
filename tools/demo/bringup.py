"""Bringing the demo up, step by step: the control plane and the fleet's Nodes, containerd and the registry
(with the upgrade artifact and the controller's and hubs' image pushed), the controller, the hubs on
port 0 (their ports read back from the files they write) and the edge agents."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Sequence
from typing import Final

from roles.common.tls import generate_serving_certificate
from tools.demo import devices
from tools.demo import diagnosis as diag
from tools.demo.fleet import (
    CANARIES,
    RING_LABEL,
    Hub,
    controller_config,
    edge_config,
    edge_launcher,
    hub_config,
    plan_edges,
)
from tools.demo.heartbeat import Heartbeat
from tools.demo.kube import Api, ApiFailure, hubs_of_nodes, register_edge, register_token
from tools.demo.procs import Child
from tools.demo.runtime import start_runtime
from tools.demo.state import Demo
from tools.ports import free_port, free_ports, reported
from tools.processes import http_get, role_command
from tools.provision import controlplane as _cp
from tools.provision import kubebuild
from tools.provision.containerd import RuntimeServicesError
from tools.provision.image import build_and_push, project_version
from tools.provision.image_tools import ImageError
from tools.provision.upgrade_artifact import PushError
from tools.provision.upgrade_artifact import push as push_artifact

UPGRADE_REPOSITORY: Final = "nodetaskd/agent"
UPGRADE_VERSION: Final = "v0.2.0"
"""What ``containers/samples/nodeupgradejob.yaml`` upgrades the canaries to."""
KUBELET_REPOSITORY: Final = "nodetaskd/kubelet"
KUBELET_VERSION: Final = f"v{kubebuild.NEXT_KUBELET_VERSION}"
"""The kubelet the kubelet upgrade installs: the same source as the nodes', built with another version."""
IMAGE_REPOSITORY: Final = "nodetaskd/nodetaskd"
"""Where the controller's and hubs' image (``containers/Containerfile``) goes in the demo's registry."""
CRD_DIR: Final = _cp.REPO_ROOT / "schemas" / "crds"
DOWN_APPS: Final = 2
"""Main-ring nodes (the first ones) whose app the diagnosis finds down."""


def provision_cluster(demo: Demo) -> Api:
    """Start the control plane (building kube-apiserver first if needed), apply the CRDs and RBAC; an admin client."""
    if not _cp.apiserver_binary_path().exists():
        demo.say(
            "kube-apiserver is not built on this machine yet: building it from Debian's source now "
            "(about 7 minutes on 2 cores, once; progress below)",
            "yellow",
        )
    binaries = _cp.ensure_binaries()
    demo.cp = cp = _cp.start(demo.layout.cluster, binaries, node_monitor=devices.NODE_MONITOR)
    demo.record()
    demo.say(f"control plane up: kube-apiserver {cp.server} + etcd (logs in {demo.layout.cluster})")
    cp.kubectl("apply", "-f", str(CRD_DIR))
    cp.kubectl("wait", "--for=condition=established", "--timeout=60s", "-f", str(CRD_DIR), timeout=90)
    cp.apply_rbac()
    demo.say(f"CRDs from {CRD_DIR.relative_to(_cp.REPO_ROOT)} established, RBAC applied")
    return Api(server=cp.server, token=cp.tokens["admin"], context=cp.ssl_context())


def register_fleet(demo: Demo, api: Api) -> dict[str, str]:
    """Plan the edges over the hubs and register their Nodes Ready; each edge's token."""
    # The edge agent's local API cannot report a port it bound: its port is picked, just before it starts.
    demo.edges = plan_edges(demo.args.nodes, demo.hubs, local_api_port=free_port())
    tokens = {e.name: register_edge(api, e.name, {RING_LABEL: e.ring}) for e in demo.edges}
    demo.heartbeat = Heartbeat(api, [e.name for e in demo.edges])
    demo.heartbeat.start()
    canaries = ", ".join(e.name for e in demo.edges if e.ring == "canary")
    demo.say(
        f"{len(demo.edges)} edge Nodes registered Ready with their token Secrets "
        f"(kube-system/nodetaskd-edge-<node>), their Leases renewed by the demo as the kubelet they lack would; "
        f"canary ring: {canaries}, main ring: the rest"
    )
    return tokens


def provision_runtime(demo: Demo, repositories: list[str]) -> str:
    """Start containerd + registry; return the CRI endpoint the edges get."""
    if demo.args.no_runtime:
        demo.runtime_problem = "--no-runtime was given"
    else:
        try:
            demo.runtime = start_runtime(demo.layout.runtime, repositories)
        except RuntimeServicesError as exc:
            demo.runtime_problem = " ".join(str(exc).split())[:300]
    if demo.runtime is None:
        demo.say(
            f"NO CONTAINER RUNTIME: {demo.runtime_problem}. The image pre-pulls run without one: "
            "each edge's Pull action reports that no container runtime is available.",
            "bold yellow",
        )
        return demo.layout.no_runtime_socket()
    demo.record()
    rt = demo.runtime
    demo.say(
        f"containerd at {rt.containerd.endpoint} and a registry at {rt.registry.host} "
        f"seeded with {', '.join(rt.images)} (all edges share this containerd)"
    )
    return rt.containerd.endpoint


def start_control(demo: Demo, hub_names: Sequence[str]) -> None:
    """Start the controller and the hubs (on port 0); return once each leads or serves, the hubs' ports known."""
    assert demo.cp is not None
    layout = demo.layout
    demo.hub_cert = cert = generate_serving_certificate(layout.hub_tls, dns_names=["localhost"])
    # The controller registers its webhook's URL before it binds: its ports are picked, just before it starts.
    webhook_port, metrics_port = free_ports(2)
    config = controller_config(
        layout, kubeconfig=demo.cp.kubeconfig("controller"), webhook_port=webhook_port, metrics_port=metrics_port
    )
    demo.procs.start("controller", role_command("controller", config), log=layout.log("controller"))
    started = [start_hub(demo, name) for name in hub_names]
    demo.record()
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    demo.wait(
        "the controller to lead and register its admission webhooks",
        lambda: "nodetaskd_controller_leader 1.0" in _http(metrics) and _webhooks_registered(demo),
        limit=60,
    )
    demo.say(f"controller leading, webhooks registered at https://127.0.0.1:{webhook_port} (log {layout.logs})")
    demo.hubs = [hub_bound(demo, child) for child in started]
    for hub in demo.hubs:
        demo.wait(f"{hub.name} to be ready", answers_ok(hub.ready_url, demo.hub_client()), limit=60)
    demo.say(
        f"hubs ready: {', '.join(f'{h.name} {h.url}' for h in demo.hubs)} (TLS, CA {cert.cert_file.parent}); "
        f"each bound port 0 and wrote the ports it got to {layout.run}/<hub>.ports.json"
    )


def start_hub(demo: Demo, name: str, *, port: int = 0, http_port: int = 0) -> Child:
    """Start hub ``name``: on port 0, or on the ports of its previous run."""
    assert demo.cp is not None
    assert demo.hub_cert is not None
    cert = demo.hub_cert
    config = hub_config(
        demo.layout,
        name,
        kubeconfig=demo.cp.kubeconfig("cloud"),
        cert=cert.cert_file,
        key=cert.key_file,
        port=port,
        http_port=http_port,
    )
    demo.hub_starts[name] = demo.hub_starts.get(name, 0) + 1
    return demo.procs.start(name, role_command("cloud", config), log=demo.layout.log(name))


def hub_bound(demo: Demo, child: Child) -> Hub:
    """The hub ``child`` is, with the ports it reported, once it has (its pid in the file: not an old one)."""
    path = demo.layout.ports(child.name)
    bound: dict[str, int] = {}

    def reported_both() -> bool:
        bound.update(reported(path, pid=child.pid) or {})
        return {"listen", "httpListen"} <= bound.keys()

    demo.wait(f"{child.name} to report the ports it bound", reported_both, limit=60)
    return Hub(child.name, bound["listen"], bound["httpListen"])


def _webhooks_registered(demo: Demo) -> bool:
    """Whether the controller has registered its validating webhooks."""
    assert demo.api is not None
    try:
        demo.api.get("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/nodetaskd")
    except ApiFailure:
        return False
    return True


def publish_upgrade(demo: Demo) -> None:
    """Push this project, as agent version UPGRADE_VERSION, to the registry the upgrade job names."""
    if demo.runtime is None:
        demo.say("no registry: the agent upgrade's Check will report its artifact missing")
        return
    image = f"{demo.runtime.registry.host}/{UPGRADE_REPOSITORY}"
    push_artifact(image, UPGRADE_VERSION)
    demo.say(f"upgrade artifact: this project as agent {UPGRADE_VERSION}, pushed to {image}:{UPGRADE_VERSION}")
    if os.geteuid() != 0:
        return  # no real nodes, no kubelet to upgrade
    image = f"{demo.runtime.registry.host}/{KUBELET_REPOSITORY}"
    try:
        kubelet = kubebuild.ensure_built(("kubelet-next",))["kubelet-next"]
        push_artifact(image, KUBELET_VERSION, kubelet=kubelet.read_bytes())
    except (_cp.ControlPlaneError, PushError, OSError) as exc:
        demo.say(f"NO KUBELET ARTIFACT (the kubelet upgrade will fail its Check): {exc}", "bold yellow")
        return
    demo.say(f"kubelet artifact: kubelet {KUBELET_VERSION} (the nodes' source, another version), pushed to {image}")


def publish_image(demo: Demo) -> None:
    """Build the controller's and hubs' image without a container engine and push it to the demo's registry.

    The demo's own processes run from this checkout (a container runtime here cannot run images);
    the image is what ``containers/deploy/`` runs in a cluster.
    """
    if demo.runtime is None:
        demo.say("no registry: the controller's and hubs' image is not built")
        return
    reference = f"{demo.runtime.registry.host}/{IMAGE_REPOSITORY}:{project_version()}"
    with demo.console.status("building the controller's and hubs' image (tools/provision/image.py, no daemon)"):
        try:
            pushed = build_and_push(reference, layout=demo.layout.root / "image")
        except (ImageError, RuntimeServicesError, _cp.ControlPlaneError) as exc:
            demo.say(f"THE IMAGE WAS NOT BUILT: {' '.join(str(exc).split())[:300]}", "bold yellow")
            return
    demo.say(f"controller and hub image (containers/Containerfile, built by umoci, pushed by skopeo): {pushed}")


def start_edges(demo: Demo, tokens: dict[str, str], cri_endpoint: str) -> None:
    """Start the diagnosis's world and the edge agents (each under its launcher), and wait for their sessions."""
    assert demo.api is not None
    ca_file = demo.layout.hub_tls / "ca.crt"
    # The diagnosis's world runs before the edges, whose configs list the ports their Tasks reach in it.
    names = [e.name for e in demo.edges]
    demo.directory = directory = diag.Directory(names, names[CANARIES : CANARIES + DOWN_APPS])
    for edge in demo.edges:
        config = edge_config(
            demo.layout,
            edge,
            token=tokens[edge.name],
            ca_file=ca_file,
            cri_endpoint=cri_endpoint,
            loopback_ports=directory.loopback_ports(edge.name),
        )
        demo.procs.start(edge.name, edge_launcher(config), log=demo.layout.log(edge.name))
    demo.record()
    full = next(e.name for e in demo.edges if e.full_disk)
    demo.say(
        f"{len(demo.edges)} edge agents started (configs in {demo.layout.root / 'edges'}); {full} runs with "
        "maxDiskUsage 1%, so its disk check fails like a nearly full disk"
    )
    api = demo.api
    missing: list[str] = []

    def all_connected() -> bool:
        held = hubs_of_nodes(api)
        missing[:] = [e.name for e in demo.edges if not held.get(e.name)]
        return not missing

    limit = 60 + 3 * len(demo.edges)
    if demo.wait("every edge to hold a hub session", all_connected, limit=limit, fatal=False):
        held = hubs_of_nodes(api)
        per_hub = {h: sum(1 for e in demo.edges if held.get(e.name) == h) for h in sorted(set(held.values()))}
        demo.say("edges connected: " + ", ".join(f"{n} on {h}" for h, n in per_hub.items()))
    else:
        demo.say(f"not connected after {limit}s: {', '.join(missing)} (see their logs)", "bold yellow")


def answers_ok(url: str, context: ssl.SSLContext) -> Callable[[], bool]:
    """A check that ``url`` (a hub's /readyz) answers ``ok``."""
    return lambda: _http(url, context).strip() == "ok"


def _http(url: str, context: ssl.SSLContext | None = None) -> str:
    return http_get(url, context=context, timeout=3)[1]


def start_devices(demo: Demo, cri_endpoint: str) -> None:
    """Start the devices' agents (their tokens registered, not their Nodes), then the real nodes' bring-up
    in a thread of its own (:class:`tools.demo.devices.Devices`), beside the scenes that follow."""
    assert demo.api is not None
    assert demo.cp is not None
    if os.geteuid() != 0:
        demo.devices = devices.Devices(demo.cp, demo.layout.nodes, [], demo.say)
        demo.devices.view.problem = "real nodes need root (cgroups, mounts, bridges)"
        demo.say(f"NO REAL NODES: {demo.devices.view.problem}", "bold yellow")
        return
    *node_api_ports, healthz_port = free_ports(len(devices.NAMES) + 1)
    planned = devices.plan_devices(demo.hubs, node_api_ports, healthz_port)
    ca_file = demo.layout.hub_tls / "ca.crt"
    image = f"{demo.runtime.registry.host}/{KUBELET_REPOSITORY}" if demo.runtime else ""
    for edge in planned:
        token = register_token(demo.api, edge.name)
        config = edge_config(
            demo.layout, edge, token=token, ca_file=ca_file, cri_endpoint=cri_endpoint, kubelet_image=image
        )
        demo.procs.start(edge.name, edge_launcher(config), log=demo.layout.log(edge.name))
    demo.record()
    demo.layout.nodes.mkdir(parents=True, exist_ok=True)
    demo.devices = devices.Devices(demo.cp, demo.layout.nodes, planned, demo.say)
    demo.devices.start()
    demo.say(
        f"devices {', '.join(devices.NAMES)}: agents started with nodeApi (their kubelets' API server); "
        f"their nodes and {devices.CLOUD_NODE} start beside the jobs (state in {demo.layout.nodes})"
    )
