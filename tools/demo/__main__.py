"""``just demo``: nodetaskd doing its job for real on this machine, from an empty state to a summary.

What runs, all on loopback and all owned by this process:

- a kube-apiserver + etcd (``tools/provision/controlplane.py``; the first run on a machine builds kube-apiserver,
  which takes minutes and shows its progress), with the CRDs and RBAC applied, and N edge Nodes
  registered as a kubelet would (labelled ``node-role.kubernetes.io/edge``, Ready) with their tokens;
- a containerd and a registry seeded with the sample jobs' images (``tools/provision/containerd.py``) when they
  can run here; otherwise the demo says so and the edges run without a container runtime; the registry
  also gets the controller's and hubs' image, built without a container engine (``tools/provision/image.py``),
  and its digest is printed;
- ``nodetaskd --role=controller`` (admission webhooks registered), two ``--role=cloud`` hubs over TLS,
  and N ``--role=edge`` agents split across the hubs, each with its own config, token and store. The
  hubs bind port 0 and write the ports they got to their ``portsFile``; the edges are configured with
  those, so no port is chosen ahead of its bind.

Then the sample jobs in ``containers/samples`` are applied and followed live until every job ends
(or the time limit). The tolerant pre-pull fails on the node whose disk check cannot pass; the demo
then frees that node's disk threshold with a ConfigUpdateJob and retries the pre-pull (the
``nodetask.kubeedge.io/retry`` annotation), which runs again on that node only. Then the sample
diagnosis runs over every edge (``tools/demo/diagnosis.py``: its first path fails on some nodes,
whose app refuses connections, and its second succeeds). Then one edge, whose Node asks for
autonomy, is cut off from its hub, and the demo's kubectl still reads that device's local API
(``tools/demo/autonomy.py``); then the hub is started again on its ports, and the edge reconnects and
relists its cache, a change made meanwhile in the cloud included. A summary says what happened and
why, each retried node's two attempts, the diagnosis's paths, the cut-off edge's return, each Node's
Autonomy condition and label and each hub's state included, and everything is stopped again - on
Ctrl-C too. Whatever is not built yet in nodetaskd shows up as the reason the nodes report, never
hidden. The state directory (default ``~/.cache/nodetaskd/demo``) keeps configs and logs until the
next run wipes it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import select
import shutil
import signal
import ssl
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

import msgspec
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from nodetask.autonomy import AUTONOMY_ANNOTATION, STATUS_LABEL
from roles.common.tls import ServingCertificate, generate_serving_certificate
from schemas.core import RETRY_ANNOTATION
from tools.demo import autonomy
from tools.demo import diagnosis as diag
from tools.demo.confirm import AFTER, Confirmer
from tools.demo.fleet import (
    CANARIES,
    RING_LABEL,
    Edge,
    Hub,
    HubState,
    Layout,
    controller_config,
    edge_config,
    edge_launcher,
    hub_config,
    plan_edges,
)
from tools.demo.kube import Api, ApiFailure, JobView, hubs_of_nodes, list_jobs, recent_events, register_edge
from tools.demo.procs import Child, Supervisor, kill_recorded, write_record
from tools.demo.runtime import Runtime, start_runtime
from tools.demo.view import (
    WAITING_CONFIRMATION,
    attempts,
    events_table,
    live_view,
    paused_for_confirmation,
    reasons,
    summary_table,
)
from tools.ports import free_port, free_ports, held, reported
from tools.processes import http_get, processes_in_sessions, role_command
from tools.provision import controlplane as _cp
from tools.provision.containerd import RuntimeServicesError
from tools.provision.image import ImageError, build_and_push, project_version
from tools.provision.upgrade_artifact import push as push_artifact

SAMPLES_DIR: Final = _cp.REPO_ROOT / "containers" / "samples"
UPGRADE_REPOSITORY: Final = "nodetaskd/agent"
UPGRADE_VERSION: Final = "v0.2.0"
"""What ``containers/samples/nodeupgradejob.yaml`` upgrades the canaries to."""
IMAGE_REPOSITORY: Final = "nodetaskd/nodetaskd"
"""Where the controller's and hubs' image (``containers/Containerfile``) goes in the demo's registry."""
CRD_DIR: Final = _cp.REPO_ROOT / "schemas" / "crds"
SAMPLES: Final = (
    "imageprepulljob.yaml",
    "configupdatejob.yaml",
    "nodeupgradejob.yaml",
    "imageprepulljob-tolerant.yaml",
)
TOLERANT: Final = "prepull-tolerant"
"""The sample the demo retries once its failing node's disk threshold is freed."""
RETRY_VALUE: Final = "disk-threshold-freed"
FREED_DISK_USAGE: Final = "100"
"""maxDiskUsage the ConfigUpdateJob gives the full-disk node: no disk is more than 100% used."""
REGISTRY_PLACEHOLDER: Final = "REGISTRY/"
NO_REGISTRY: Final = "registry.invalid/"
"""Where images point when no registry runs (``.invalid`` never resolves; nothing pulls them anyway)."""
MARKER_FILE: Final = ".nodetaskd-demo"
"""Marks a directory as the demo's, so that only such a directory is ever wiped."""
EVENTS_SHOWN: Final = 6
POLL_SECONDS: Final = 1.0
DOWN_APPS: Final = 2
"""Main-ring nodes (the first ones) whose app the diagnosis finds down."""
LINGER_LIMIT: Final = 900.0
"""Longest the demo waits, after its summary, for Enter before stopping by itself."""
HUB_NAMES: Final = ("hub-a", "hub-b")
RETURN_LIMIT: Final = 90.0
"""Longest the cut-off edge may take to reconnect to its returned hub and relist: its reconnect backoff
reaches 30 s only after about a minute of refused attempts."""


class DemoError(RuntimeError):
    """The demo cannot go on; the message says what failed and where its log is."""


def default_state_dir() -> Path:
    env = os.environ.get("NODETASKD_DEMO_DIR")
    return Path(env).expanduser().resolve() if env else _cp.cache_dir() / "demo"


@dataclass
class Demo:
    """One run: what it started (so that :meth:`stop` can stop exactly that) and what it saw."""

    args: argparse.Namespace
    console: Console
    layout: Layout
    procs: Supervisor
    cp: _cp.ControlPlane | None = None
    runtime: Runtime | None = None
    runtime_problem: str = ""
    api: Api | None = None
    hubs: list[Hub] = field(default_factory=list)
    """The hubs started, with the ports each reported it bound."""
    hub_starts: dict[str, int] = field(default_factory=dict)
    hub_cert: ServingCertificate | None = None
    edges: list[Edge] = field(default_factory=list)
    job_names: list[str] = field(default_factory=list)
    updated_settings: dict[str, list[str]] = field(default_factory=dict)
    """Per ConfigUpdateJob, the edge settings it sets (read back from the edges' files in the summary)."""
    jobs: list[JobView] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    confirmer: Confirmer | None = None
    directory: diag.Directory | None = None
    diagnosis: diag.DiagnosisView | None = None
    cut_off: autonomy.AutonomyView | None = None
    """What the autonomy step showed (:meth:`cut_off_edge`)."""
    nodes_autonomy: list[autonomy.NodeAutonomy] = field(default_factory=list)
    """Every Node's Autonomy condition and label, as the summary read them."""
    hub_states: list[HubState] = field(default_factory=list)
    """Every hub as the summary found it."""
    started: float = field(default_factory=time.monotonic)

    # ------------------------------------------------------------------------------ set-up

    def say(self, message: str, style: str = "") -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(f"[dim]{elapsed:6.1f}s[/dim] {message}", style=style, highlight=False)

    def record(self) -> None:
        pids = [*(self.cp.pids.values() if self.cp else ()), *(self.runtime.pids if self.runtime else ())]
        write_record(self.layout.record, [*pids, *(c.pid for c in self.procs.children)])

    def provision_cluster(self) -> Api:
        if not _cp.apiserver_binary_path().exists():
            self.say(
                "kube-apiserver is not built on this machine yet: building it from Debian's source now "
                "(about 7 minutes on 2 cores, once; progress below)",
                "yellow",
            )
        binaries = _cp.ensure_binaries()
        self.cp = cp = _cp.start(self.layout.cluster, binaries)
        self.record()
        self.say(f"control plane up: kube-apiserver {cp.server} + etcd (logs in {self.layout.cluster})")
        cp.kubectl("apply", "-f", str(CRD_DIR))
        cp.kubectl("wait", "--for=condition=established", "--timeout=60s", "-f", str(CRD_DIR), timeout=90)
        cp.apply_rbac()
        self.say(f"CRDs from {CRD_DIR.relative_to(_cp.REPO_ROOT)} established, RBAC applied")
        return Api(server=cp.server, token=cp.tokens["admin"], context=cp.ssl_context())

    def register_fleet(self, api: Api) -> dict[str, str]:
        # The edge agent's local API cannot report a port it bound: its port is picked, just before it starts.
        self.edges = plan_edges(self.args.nodes, self.hubs, local_api_port=free_port())
        tokens = {e.name: register_edge(api, e.name, {RING_LABEL: e.ring}) for e in self.edges}
        canaries = ", ".join(e.name for e in self.edges if e.ring == "canary")
        self.say(
            f"{len(self.edges)} edge Nodes registered Ready with their token Secrets "
            f"(kube-system/nodetaskd-edge-<node>); canary ring: {canaries}, main ring: the rest"
        )
        return tokens

    def provision_runtime(self, repositories: list[str]) -> str:
        """Start containerd + registry; return the CRI endpoint the edges get."""
        if self.args.no_runtime:
            self.runtime_problem = "--no-runtime was given"
        else:
            try:
                self.runtime = start_runtime(self.layout.runtime, repositories)
            except RuntimeServicesError as exc:
                self.runtime_problem = " ".join(str(exc).split())[:300]
        if self.runtime is None:
            self.say(
                f"NO CONTAINER RUNTIME: {self.runtime_problem}. The image pre-pulls run without one: "
                "each edge's Pull action reports that no container runtime is available.",
                "bold yellow",
            )
            return self.layout.no_runtime_socket()
        self.record()
        rt = self.runtime
        self.say(
            f"containerd at {rt.containerd.endpoint} and a registry at {rt.registry.host} "
            f"seeded with {', '.join(rt.images)} (all edges share this containerd)"
        )
        return rt.containerd.endpoint

    def start_control(self, hub_names: Sequence[str]) -> None:
        """Start the controller and the hubs (on port 0); return once each leads or serves, the hubs' ports known."""
        assert self.cp is not None
        layout = self.layout
        self.hub_cert = cert = generate_serving_certificate(layout.hub_tls, dns_names=["localhost"])
        # The controller registers its webhook's URL before it binds: its ports are picked, just before it starts.
        webhook_port, metrics_port = free_ports(2)
        config = controller_config(
            layout, kubeconfig=self.cp.kubeconfig("controller"), webhook_port=webhook_port, metrics_port=metrics_port
        )
        self.procs.start("controller", role_command("controller", config), log=layout.log("controller"))
        started = [self.start_hub(name) for name in hub_names]
        self.record()
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        self.wait(
            "the controller to lead and register its admission webhooks",
            lambda: "nodetaskd_controller_leader 1.0" in _http(metrics) and self._webhooks_registered(),
            limit=60,
        )
        self.say(f"controller leading, webhooks registered at https://127.0.0.1:{webhook_port} (log {layout.logs})")
        self.hubs = [self.hub_bound(child) for child in started]
        for hub in self.hubs:
            self.wait(f"{hub.name} to be ready", _answers_ok(hub.ready_url, self.hub_client()), limit=60)
        self.say(
            f"hubs ready: {', '.join(f'{h.name} {h.url}' for h in self.hubs)} (TLS, CA {cert.cert_file.parent}); "
            f"each bound port 0 and wrote the ports it got to {layout.run}/<hub>.ports.json"
        )

    def start_hub(self, name: str, *, port: int = 0, http_port: int = 0) -> Child:
        """Start hub ``name``: on port 0, or on the ports of its previous run."""
        assert self.cp is not None
        assert self.hub_cert is not None
        cert = self.hub_cert
        config = hub_config(
            self.layout,
            name,
            kubeconfig=self.cp.kubeconfig("cloud"),
            cert=cert.cert_file,
            key=cert.key_file,
            port=port,
            http_port=http_port,
        )
        self.hub_starts[name] = self.hub_starts.get(name, 0) + 1
        return self.procs.start(name, role_command("cloud", config), log=self.layout.log(name))

    def hub_bound(self, child: Child) -> Hub:
        """The hub ``child`` is, with the ports it reported, once it has (its pid in the file: not an old one)."""
        path = self.layout.ports(child.name)
        bound: dict[str, int] = {}

        def reported_both() -> bool:
            bound.update(reported(path, pid=child.pid) or {})
            return {"listen", "httpListen"} <= bound.keys()

        self.wait(f"{child.name} to report the ports it bound", reported_both, limit=60)
        return Hub(child.name, bound["listen"], bound["httpListen"])

    def hub_client(self) -> ssl.SSLContext:
        """A TLS client trusting the hubs' CA."""
        assert self.hub_cert is not None
        return ssl.create_default_context(cadata=self.hub_cert.ca_bundle.decode())

    def _webhooks_registered(self) -> bool:
        assert self.api is not None
        try:
            self.api.get("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/nodetaskd")
        except ApiFailure:
            return False
        return True

    def publish_upgrade(self) -> None:
        """Push this project, as agent version UPGRADE_VERSION, to the registry the upgrade job names."""
        if self.runtime is None:
            self.say("no registry: the agent upgrade's Check will report its artifact missing")
            return
        image = f"{self.runtime.registry.host}/{UPGRADE_REPOSITORY}"
        push_artifact(image, UPGRADE_VERSION)
        self.say(f"upgrade artifact: this project as agent {UPGRADE_VERSION}, pushed to {image}:{UPGRADE_VERSION}")

    def publish_image(self) -> None:
        """Build the controller's and hubs' image without a container engine and push it to the demo's registry.

        The demo's own processes run from this checkout (a container runtime here cannot run images);
        the image is what ``containers/deploy/`` runs in a cluster.
        """
        if self.runtime is None:
            self.say("no registry: the controller's and hubs' image is not built")
            return
        reference = f"{self.runtime.registry.host}/{IMAGE_REPOSITORY}:{project_version()}"
        with self.console.status("building the controller's and hubs' image (tools/provision/image.py, no daemon)"):
            try:
                pushed = build_and_push(reference, layout=self.layout.root / "image")
            except (ImageError, RuntimeServicesError, _cp.ControlPlaneError) as exc:
                self.say(f"THE IMAGE WAS NOT BUILT: {' '.join(str(exc).split())[:300]}", "bold yellow")
                return
        self.say(f"controller and hub image (containers/Containerfile, built by umoci, pushed by skopeo): {pushed}")

    def start_edges(self, tokens: dict[str, str], cri_endpoint: str) -> None:
        assert self.api is not None
        ca_file = self.layout.hub_tls / "ca.crt"
        # The diagnosis's world runs before the edges, whose configs list the ports their Tasks reach in it.
        names = [e.name for e in self.edges]
        self.directory = directory = diag.Directory(names, names[CANARIES : CANARIES + DOWN_APPS])
        for edge in self.edges:
            config = edge_config(
                self.layout,
                edge,
                token=tokens[edge.name],
                ca_file=ca_file,
                cri_endpoint=cri_endpoint,
                loopback_ports=directory.loopback_ports(edge.name),
            )
            self.procs.start(edge.name, edge_launcher(config), log=self.layout.log(edge.name))
        self.record()
        full = next(e.name for e in self.edges if e.full_disk)
        self.say(
            f"{len(self.edges)} edge agents started (configs in {self.layout.root / 'edges'}); {full} runs with "
            "maxDiskUsage 1%, so its disk check fails like a nearly full disk"
        )
        api = self.api
        missing: list[str] = []

        def all_connected() -> bool:
            held = hubs_of_nodes(api)
            missing[:] = [e.name for e in self.edges if not held.get(e.name)]
            return not missing

        limit = 60 + 3 * len(self.edges)
        if self.wait("every edge to hold a hub session", all_connected, limit=limit, fatal=False):
            held = hubs_of_nodes(api)
            per_hub = {h: sum(1 for e in self.edges if held.get(e.name) == h) for h in sorted(set(held.values()))}
            self.say("edges connected: " + ", ".join(f"{n} on {h}" for h, n in per_hub.items()))
        else:
            self.say(f"not connected after {limit}s: {', '.join(missing)} (see their logs)", "bold yellow")

    def wait(self, what: str, ready: Callable[[], bool], *, limit: float, fatal: bool = True) -> bool:
        """Poll ``ready`` up to ``limit`` seconds, failing early if a process the demo started died."""
        deadline = time.monotonic() + limit
        with self.console.status(f"waiting for {what}"):
            while True:
                dead = self.procs.dead()
                if dead:
                    first = dead[0]
                    raise DemoError(
                        f"{first.name} exited with status {first.popen.returncode} while waiting for {what}; "
                        f"log {first.log}:\n{_cp._tail(first.log, 15)}"
                    )
                with contextlib.suppress(ApiFailure):
                    if ready():
                        return True
                if time.monotonic() >= deadline:
                    if fatal:
                        raise DemoError(f"gave up waiting for {what} after {limit:.0f}s; logs in {self.layout.logs}")
                    return False
                time.sleep(0.5)

    # ------------------------------------------------------------------------------ the jobs

    def apply_jobs(self, registry: str) -> None:
        """Apply the samples with one kubectl call (through the admission webhooks, as a user would)."""
        assert self.cp is not None
        manifests = [render_sample(SAMPLES_DIR / name, registry=registry) for name in SAMPLES]
        self.job_names = [m["metadata"]["name"] for m in manifests]
        for m in manifests:
            if m["kind"] == "ConfigUpdateJob":
                self.updated_settings[m["metadata"]["name"]] = sorted(m["spec"]["updateFields"])
        listing = {"apiVersion": "v1", "kind": "List", "items": manifests}
        out = self.cp.kubectl("apply", "-f", "-", input=json.dumps(listing)).stdout.split("\n")
        self.say(f"kubectl apply -f containers/samples/ ({', '.join(SAMPLES)}):")
        for line in filter(None, out):
            self.say(f"  {line}")

    def follow(self, until: Callable[[list[JobView]], bool] | None = None) -> None:
        """Show the jobs live until ``until`` holds (default: every sample has ended) or the time limit passes."""
        assert self.api is not None
        api = self.api
        deadline = time.monotonic() + self.args.timeout
        phases: dict[str, str] = {job.name: job.phase for job in self.jobs}
        assert self.cp is not None
        if self.confirmer is None:
            self.confirmer = Confirmer(cp=self.cp, procs=self.procs, layout=self.layout, say=self.say)
        confirmer = self.confirmer
        done = until or (lambda jobs: len(jobs) >= len(SAMPLES) and all(j.ended for j in jobs))
        help_text = f"The demo releases each after {AFTER:.0f}s: one from the cloud, one on the device."
        # Transient: the summary, printed next, replaces the last frame.
        with Live(console=self.console, auto_refresh=False, transient=True) as live:
            while True:
                order = {name: i for i, name in enumerate(self.job_names)}
                jobs = sorted(list_jobs(api), key=lambda j: order.get(j.name, len(order)))
                events = recent_events(api, EVENTS_SHOWN)
                self.jobs = jobs
                for job in jobs:
                    if phases.get(job.name, "") != job.phase:
                        before = phases.get(job.name) or "(new)"
                        phases[job.name] = job.phase
                        self.say(f"{job.name}: {before} -> {job.phase or '(new)'}")
                for job in jobs:
                    confirmer.release(job)
                confirmer.report()
                for child in self.procs.dead():
                    # Only a role process ends here: confirmations were reported (and removed) above.
                    self.say(f"{child.name} exited with status {child.popen.returncode} (log {child.log})", "red")
                    self.procs.children.remove(child)
                elapsed = time.monotonic() - self.started
                header = f"{self.runtime_line()}   elapsed {elapsed:.0f}s, limit {self.args.timeout:.0f}s for the jobs"
                live.update(live_view(jobs, events, header=header, confirmation_help=help_text), refresh=True)
                if done(jobs):
                    break
                if time.monotonic() >= deadline:
                    self.unfinished = [j.name for j in jobs if not j.ended]
                    self.say(f"time limit reached; not finished: {', '.join(self.unfinished)}", "bold yellow")
                    break
                time.sleep(POLL_SECONDS)
        confirmer.finish()

    def retry_tolerant(self) -> None:
        """Free the full-disk node's threshold with a ConfigUpdateJob, then retry the tolerant pre-pull."""
        assert self.cp is not None
        if self.unfinished:
            self.say(f"not retrying {TOLERANT}: the jobs did not all finish", "yellow")
            return
        full = next(e.name for e in self.edges if e.full_disk)
        tolerant = next((j for j in self.jobs if j.name == TOLERANT), None)
        failed = [n.name for n in tolerant.nodes if n.phase in ("Failure", "Unknown")] if tolerant else []
        if not failed:
            self.say(f"not retrying {TOLERANT}: none of its nodes failed", "yellow")
            return
        update = free_disk_job(full)
        name = update["metadata"]["name"]
        self.job_names.append(name)
        self.updated_settings[name] = sorted(update["spec"]["updateFields"])
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(update))
        self.say(
            f"{TOLERANT} failed on {', '.join(failed)}: freeing {full}'s disk threshold with ConfigUpdateJob "
            f"{name} (maxDiskUsage {FREED_DISK_USAGE}), then retrying the pre-pull"
        )
        self.follow(until=lambda jobs: any(j.name == name and j.ended for j in jobs))
        if self.unfinished:
            return
        args = ("annotate", "--overwrite", "imageprepulljob", TOLERANT, f"{RETRY_ANNOTATION}={RETRY_VALUE}")
        self.cp.kubectl(*args)
        self.say(f"kubectl {' '.join(args)}")
        self.follow(until=lambda jobs: any(j.name == TOLERANT and j.run > 1 and j.ended for j in jobs))

    # ------------------------------------------------------------------------------ the diagnosis

    def diagnose(self) -> None:
        """Apply the diagnosis samples (pipeline first, then the run) and follow the run to its end."""
        assert self.api is not None
        assert self.cp is not None
        assert self.directory is not None
        api = self.api
        directory = self.directory
        self.say(
            f"diagnosis: the fleet's directory at http://127.0.0.1:{directory.port}/network gives each edge its app's"
            f" address; the app of {', '.join(directory.down)} refuses connections (each edge's config lists both"
            " ports in diagnosis.loopbackPorts)"
        )
        listing = diag.render_operations(SAMPLES_DIR, directory_port=directory.port)
        out = self.cp.kubectl("apply", "-f", "-", input=json.dumps(listing)).stdout
        self.say(f"kubectl apply -f containers/samples/{diag.OPERATIONS_SAMPLE}: {' '.join(out.split())}")
        manifest = diag.render_diagnosis(SAMPLES_DIR)
        name = manifest["metadata"]["name"]
        operation_set = manifest["spec"]["operationSet"]
        # A Diagnosis of an OperationSet the controller has not seen yet fails at once (OperationSetNotFound).
        self.wait(
            f"OperationSet {operation_set} to be ready", lambda: diag.operation_set_ready(api, operation_set), limit=60
        )
        out = self.cp.kubectl("apply", "-f", "-", input=json.dumps(manifest)).stdout
        self.say(f"kubectl apply -f containers/samples/{diag.DIAGNOSIS_SAMPLE}: {' '.join(out.split())}")
        shown = ""
        deadline = time.monotonic() + self.args.diagnosis_timeout
        found: dict[str, Any] = {}
        with self.console.status(f"diagnosis {name}") as status:
            while time.monotonic() < deadline:
                with contextlib.suppress(ApiFailure):
                    found = diag.read_diagnosis(api, name)
                now = diag.progress(found) if found else "(not read yet)"
                if now != shown:
                    shown = now
                    self.say(f"diagnosis {name}: {now}")
                    status.update(f"diagnosis {name}: {now}")
                if (found.get("status") or {}).get("phase") in diag.FINAL_PHASES:
                    break
                time.sleep(POLL_SECONDS / 2)
            else:
                self.say(f"diagnosis {name} did not end within {self.args.diagnosis_timeout:.0f}s", "bold yellow")
        if found:
            tasks = diag.read_tasks(api, found["metadata"]["uid"])
            self.diagnosis = diag.view(found, tasks, directory.asked)

    def cut_off_edge(self) -> None:
        """The autonomy step: ask autonomy for one edge's Node, give it an app, cut its hub off, read its local API."""
        assert self.api is not None
        assert self.cp is not None
        api, cp = self.api, self.cp
        edge = next(e for e in self.edges if e.local_api_port)
        hub, port = edge.hubs[0], edge.local_api_port
        autonomy.request_autonomy(api, edge.name)
        # Pod admission wants the namespace's default ServiceAccount; the controller manager may not have made it yet.
        cp.kubectl("create", "serviceaccount", "default", "-n", autonomy.NAMESPACE, check=False)
        cp.kubectl("apply", "-f", "-", input=json.dumps(autonomy.app_manifest(edge.name)))
        self.say(
            f"autonomy: {edge.name} asks for it ({AUTONOMY_ANNOTATION}=true) and gets a Pod "
            f"{autonomy.NAMESPACE}/{autonomy.POD} and its ConfigMap {autonomy.CONFIG_MAP}; its local API is on "
            f"127.0.0.1:{port}"
        )
        self.wait(
            f"{edge.name}'s local API to serve its Pod and ConfigMap", lambda: autonomy.app_cached(port), limit=60
        )
        self.wait(
            f"{edge.name}'s Autonomy condition True and the controller's {STATUS_LABEL}=true",
            lambda: autonomy.approved(api, edge.name),
            limit=60,
        )
        self.procs.stop([hub.name])
        with contextlib.ExitStack() as holding:
            # Its ports stay bound, refusing connections as the stopped hub does, until it is back on them:
            # nothing else (an outgoing connection's local port included) can take them meanwhile.
            for kept in (hub.port, hub.http_port):
                try:
                    holding.enter_context(held(kept))
                except OSError as exc:
                    raise DemoError(f"{hub.name}'s port {kept} was taken as soon as the hub stopped: {exc}") from exc
            self.say(f"{hub.name} stopped: {edge.name} lists no other hub, so it is cut off from the cloud")
            args = ("get", "pods", "-A", "--field-selector", f"spec.nodeName={edge.name}")
            command = f"kubectl --server=http://127.0.0.1:{port} {' '.join(args)}"
            home = self.layout.edge(edge.name) / "kubectl"
            result = autonomy.local_kubectl(cp.binaries.kubectl, port, home, *args)
            answer = autonomy.pod_line(result.stdout) if result.returncode == 0 else ""
            error = "" if answer else " ".join((result.stderr or result.stdout or f"exit {result.returncode}").split())
            self.cut_off = autonomy.AutonomyView(
                node=edge.name, hub=hub.name, port=port, command=command, answer=answer, error=error[:300]
            )
            if answer:
                self.say(f"$ {command}\n    {answer}")
            else:
                self.say(f"{command} failed: {error[:300]}", "bold yellow")
            returned = self.bring_back(edge, hub, holding)
        self.cut_off = dataclasses.replace(self.cut_off, returned=returned)

    def bring_back(self, edge: Edge, hub: Hub, holding: contextlib.ExitStack) -> autonomy.HubReturn:
        """Change the app's ConfigMap in the cloud, start ``hub`` again on its ports (held by ``holding`` till then)
        and follow the cut-off ``edge`` back: reconnected, relisted, serving the change."""
        assert self.cp is not None
        assert self.api is not None
        api, port = self.api, edge.local_api_port
        patch = ("patch", "configmap", autonomy.CONFIG_MAP, "-n", autonomy.NAMESPACE, "--type=merge")
        self.cp.kubectl(*patch, "-p", autonomy.greeting_change())
        self.say(
            f"meanwhile, in the cloud: ConfigMap {autonomy.CONFIG_MAP} gets greeting {autonomy.CHANGED_GREETING!r}; "
            f"{edge.name}'s local API still serves {autonomy.local_greeting(port)!r}"
        )
        log = self.layout.log(edge.name)
        offset = log.stat().st_size
        back = self.hub_bound(self.start_hub(hub.name, port=hub.port, http_port=hub.http_port))
        self.record()
        if (back.port, back.http_port) != (hub.port, hub.http_port):
            raise DemoError(f"{hub.name} came back on ports {back.port}, {back.http_port}, not its own")
        holding.close()  # it listens on them now
        self.wait(f"{hub.name} to be ready again", _answers_ok(hub.ready_url, self.hub_client()), limit=60)
        self.say(f"{hub.name} started again on its ports ({hub.url}), which the demo kept bound while it was down")
        reconnected = relisted = ""

        def back_and_relisted() -> bool:
            nonlocal reconnected, relisted
            reconnected = reconnected or autonomy.log_line(log, offset, autonomy.RECONNECTED, f"hub={hub.name}")
            relisted = relisted or autonomy.log_line(log, offset, autonomy.RELISTED)
            # The cloud's side of the reconnect: the hub marks the Node as held by it again.
            return bool(reconnected and relisted) and hubs_of_nodes(api).get(edge.name) == hub.name

        self.wait(
            f"{edge.name} to reconnect to {hub.name} and relist its cache",
            back_and_relisted,
            limit=RETURN_LIMIT,
            fatal=False,
        )
        greeting = ""

        def changed() -> bool:
            nonlocal greeting
            greeting = autonomy.local_greeting(port)
            return greeting == autonomy.CHANGED_GREETING

        self.wait(f"{edge.name}'s local API to serve the change", changed, limit=30, fatal=False)
        returned = autonomy.HubReturn(
            hub=hub.name, url=hub.url, reconnected=reconnected, relisted=relisted, greeting=greeting
        )
        for line in autonomy.return_lines(edge.name, returned):
            self.say(escape(line), "" if returned.complete else "bold yellow")  # log lines hold [brackets]
        return returned

    def read_hubs(self) -> list[HubState]:
        """Each hub's process, readiness and edges (by the Nodes' hub annotations), now."""
        held_by: dict[str, str] = {}
        if self.api is not None:
            with contextlib.suppress(ApiFailure):
                held_by = hubs_of_nodes(self.api)
        states = []
        for hub in self.hubs:
            child = next((c for c in self.procs.children if c.name == hub.name), None)
            running = child is not None and child.alive()
            states.append(
                HubState(
                    name=hub.name,
                    url=hub.url,
                    http_port=hub.http_port,
                    pid=child.pid if child is not None else 0,
                    starts=self.hub_starts.get(hub.name, 0),
                    running=running,
                    ready=running and _answers_ok(hub.ready_url, self.hub_client())(),
                    edges=tuple(sorted(node for node, name in held_by.items() if name == hub.name)),
                )
            )
        return states

    def runtime_line(self) -> str:
        if self.runtime is None:
            return "runtime: NONE (running without a container runtime)"
        return f"runtime: containerd {self.runtime.containerd.endpoint}, registry {self.runtime.registry.host}"

    def summarize(self) -> None:
        self.console.print()
        if self.api is not None:
            with contextlib.suppress(ApiFailure):
                self.console.print(events_table(recent_events(self.api, EVENTS_SHOWN)))
        self.console.print(summary_table(self.jobs, self.unfinished))
        for line in self.findings():
            self.console.print(f"- {line}", highlight=False)
        if self.diagnosis is not None:
            self.console.print()
            down = self.directory.down if self.directory else ()
            for line in diag.summary_lines(self.diagnosis, down=down):
                self.console.print(line, highlight=False)
        if self.api is not None:
            with contextlib.suppress(ApiFailure):
                self.nodes_autonomy = autonomy.node_autonomy(self.api)
            self.console.print()
            for line in autonomy.summary_lines(self.cut_off, self.nodes_autonomy):
                self.console.print(line, highlight=False, markup=False)
        self.hub_states = self.read_hubs()
        if self.hub_states:
            self.console.print("\nhubs (each bound port 0 at its first start and reported the ports it got):")
            for hub in self.hub_states:
                self.console.print(f"  {hub.line()}", highlight=False)
        kubeconfig = self.layout.cluster / "admin.kubeconfig"
        self.console.print(
            "\nTo look further (while the demo runs: in a terminal it waits for Enter here):", style="bold"
        )
        for command in (
            f"export KUBECONFIG={kubeconfig}",
            "kubectl get nodejobs",
            f"kubectl get nodes -L {RING_LABEL} -L nodetask.kubeedge.io/hub",
            "kubectl get imageprepulljob prepull-all-edges -o yaml",
            f"kubectl get imageprepulljob {TOLERANT} -o yaml   # status.retry, nodeStatus[].previousAttempt",
            "kubectl describe nodeupgradejob upgrade-canaries",
            "kubectl get events -n default --sort-by=.lastTimestamp",
            "kubectl get diagnosis edge-health -o yaml; kubectl get tasks",
            f"kubectl get nodes -L {STATUS_LABEL}; kubectl describe node <node>   # the Autonomy condition",
            f"cat {self.layout.ports('hub-a')}   # the ports hub-a bound (it started on port 0)",
            *(
                [f"kubectl --server=http://127.0.0.1:{self.cut_off.port} get pods,configmaps -A   # the cut-off edge"]
                if self.cut_off
                else []
            ),
        ):
            self.console.print(f"  {command}", highlight=False)
        self.console.print(f"Logs: {self.layout.logs}/<controller|hub-a|hub-b|edge-NN>.log", highlight=False)

    def findings(self) -> list[str]:
        """Plain sentences about what the run showed, each read from the jobs, files or containerd."""
        out: list[str] = []
        if self.runtime is None:
            out.append(f"Ran WITHOUT a container runtime ({self.runtime_problem}).")
        else:
            pulled = self.runtime.pulled()
            if pulled is not None:
                held = [i for i in self.runtime.images if i in pulled]
                out.append(
                    f"containerd holds {len(held)} of the {len(self.runtime.images)} seeded images after the run."
                )
            if any("container runtime is not available" in r for job in self.jobs for r in reasons(job)):
                out.append(
                    "containerd was running, yet edges report no container runtime: this edge build does not "
                    "pull through criEndpoint."
                )
        for job in self.jobs:
            out.extend(self._job_findings(job))
        return out

    def _job_findings(self, job: JobView) -> list[str]:
        out: list[str] = []
        failed = job.counts.get("failure", 0) + job.counts.get("unknown", 0)
        if job.phase == "Completed" and failed:
            out.append(
                f"{job.name}: Completed with {failed} of {job.counts.get('total', 0)} nodes failed: "
                "within its failureTolerate."
            )
        paused = paused_for_confirmation(job)
        if paused:
            out.append(f"{job.name}: {', '.join(paused)} still waited for confirmation when the demo stopped.")
        if job.run > 1:
            out.append(f"{job.name}: retried, run {job.run} ended {job.phase}. " + " ".join(attempts(job)))
        how = self.confirmer.how(job.name) if self.confirmer else ""
        if how:
            out.append(f"{job.name}: paused at WaitingConfirmation; the demo released {how}.")
        timed_out = [n.name for n in job.nodes if n.phase == "Unknown" and n.last_action == WAITING_CONFIRMATION]
        if timed_out:
            out.append(f"{job.name}: {', '.join(timed_out)} timed out while waiting for confirmation.")
        if job.kind == "ConfigUpdateJob":
            updated = [n.name for n in job.nodes if n.phase == "Successful"]
            for setting in self.updated_settings.get(job.name, ()):
                readings: dict[str, list[str]] = {}
                for name in updated:
                    readings.setdefault(str(self._edge_setting(name, setting)), []).append(name)
                for value, names in readings.items():
                    out.append(f"{job.name}: {setting} reads {value} in the edge.yaml of {_nodes(names)}.")
        return out

    def _edge_setting(self, node: str, key: str) -> object:
        try:
            config = msgspec.yaml.decode((self.layout.edge(node) / "edge.yaml").read_bytes())
        except (OSError, msgspec.DecodeError):
            return "(unreadable)"
        return config.get(key, "(unset)") if isinstance(config, dict) else "(not a mapping)"

    def linger(self) -> None:
        """With a person at the terminal, keep everything up for the kubectl commands until Enter."""
        if self.args.no_linger or not (sys.stdin.isatty() and self.console.is_terminal):
            return
        self.console.print(
            f"\nEverything is still running. Press Enter (or Ctrl-C) to stop it all; "
            f"it stops by itself after {LINGER_LIMIT / 60:.0f} minutes.",
            style="bold",
        )
        select.select([sys.stdin], [], [], LINGER_LIMIT)

    # ------------------------------------------------------------------------------ tear-down

    def stop(self) -> list[str]:
        """Stop everything this run started, in reverse order; returns processes left behind (none)."""
        self.procs.stop()
        if self.directory is not None:
            self.directory.stop()
        if self.runtime is not None:
            for error in self.runtime.stop():
                self.say(error, "red")
        if self.cp is not None:
            try:
                self.cp.stop()
            except _cp.ControlPlaneError as exc:
                self.say(str(exc), "red")
        leaders = [
            *self.procs.started,
            *(self.cp.pids.values() if self.cp else ()),
            *(self.runtime.pids if self.runtime else ()),
        ]
        left = [f"pid {pid}: {cmd[:160]}" for pid, cmd in processes_in_sessions(leaders).items()]
        self.layout.record.unlink(missing_ok=True)
        return left


def free_disk_job(node: str) -> dict[str, Any]:
    """The ConfigUpdateJob that lifts ``node``'s disk-usage ceiling, so that its disk check passes."""
    return {
        "apiVersion": "operations.kubeedge.io/v1alpha2",
        "kind": "ConfigUpdateJob",
        "metadata": {"name": f"free-disk-{node}"},
        "spec": {"nodeNames": [node], "updateFields": {"maxDiskUsage": FREED_DISK_USAGE}, "timeoutSeconds": 120},
    }


def _nodes(names: list[str]) -> str:
    return f"all {len(names)} updated nodes" if len(names) > 3 else ", ".join(names)


def render_sample(path: Path, *, registry: str) -> dict[str, Any]:
    """The sample manifest with its images pointed at ``registry``."""
    manifest: dict[str, Any] = msgspec.yaml.decode(path.read_bytes())
    spec = manifest["spec"]
    template = spec.get("imagePrePullTemplate")
    if template is not None:
        template["images"] = [i.replace(REGISTRY_PLACEHOLDER, registry, 1) for i in template["images"]]
    if isinstance(spec.get("image"), str):
        spec["image"] = spec["image"].replace(REGISTRY_PLACEHOLDER, registry, 1)
    return manifest


def sample_repositories() -> list[str]:
    """``name:tag`` of every image the samples pull from the demo registry."""
    found: dict[str, None] = {}
    for name in SAMPLES:
        manifest = msgspec.yaml.decode((SAMPLES_DIR / name).read_bytes())
        template = manifest["spec"].get("imagePrePullTemplate") or {}
        for image in template.get("images", ()):
            if image.startswith(REGISTRY_PLACEHOLDER):
                found[image.removeprefix(REGISTRY_PLACEHOLDER)] = None
    return list(found)


def _answers_ok(url: str, context: ssl.SSLContext) -> Callable[[], bool]:
    return lambda: _http(url, context).strip() == "ok"


def _http(url: str, context: ssl.SSLContext | None = None) -> str:
    return http_get(url, context=context, timeout=3)[1]


@contextlib.contextmanager
def exclusive(root: Path) -> Iterator[None]:
    """Hold ``<root>.lock``: two demos on one state directory would wipe each other's files."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DemoError(f"another demo is running from {root}") from None
        yield


def fresh_state_dir(layout: Layout) -> list[str]:
    """Empty the state directory (only a demo's), stopping leftovers of a killed run first."""
    root = layout.root
    leftovers: list[str] = []
    if root.exists():
        if any(root.iterdir()) and not (root / MARKER_FILE).exists():
            raise DemoError(f"refusing to wipe {root}: it is not a demo state directory (no {MARKER_FILE})")
        leftovers = kill_recorded(layout.record, str(root))
        shutil.rmtree(root)
    for directory in (root, layout.logs, layout.config):
        directory.mkdir(parents=True, exist_ok=True)
    (root / MARKER_FILE).write_text("state of `just demo`; wiped by the next run\n")
    return leftovers


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="just demo", description="Run nodetaskd for real on this machine, then stop it all."
    )
    p.add_argument("--nodes", type=int, default=12, help="edge nodes (and edge processes) to run; at least 4")
    p.add_argument("--state-dir", type=Path, help="where configs, logs and cluster state go (wiped at start)")
    p.add_argument("--timeout", type=float, default=300, help="seconds the jobs may take before the summary")
    p.add_argument(
        "--diagnosis-timeout", type=float, default=120, help="seconds the diagnosis may take before the summary"
    )
    p.add_argument("--no-runtime", action="store_true", help="do not start containerd and the registry")
    p.add_argument("--no-linger", action="store_true", help="stop right after the summary")
    p.add_argument("--summary-json", type=Path, help="also write the end state of the jobs to this file")
    return p


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run(demo: Demo) -> None:
    """The demo's steps, in order; raises on anything that stops it."""
    api = demo.api = demo.provision_cluster()
    cri_endpoint = demo.provision_runtime(sample_repositories())
    demo.publish_upgrade()
    demo.publish_image()
    demo.start_control(HUB_NAMES)
    # The edges are configured with the ports the hubs reported.
    tokens = demo.register_fleet(api)
    demo.start_edges(tokens, cri_endpoint)
    registry = f"{demo.runtime.registry.host}/" if demo.runtime else NO_REGISTRY
    demo.apply_jobs(registry)
    demo.say(f"follow along: export KUBECONFIG={demo.layout.cluster / 'admin.kubeconfig'}; kubectl get nodejobs -w")
    demo.follow()
    demo.retry_tolerant()
    demo.diagnose()
    demo.cut_off_edge()
    demo.summarize()
    demo.linger()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.nodes < 4:
        print("just demo: --nodes must be at least 4 (two canaries and a main ring of two or more)", file=sys.stderr)
        return 2
    root = (args.state_dir or default_state_dir()).expanduser().resolve()
    console = Console(highlight=False)
    if not console.is_terminal:
        # Logs and CI: no terminal to fit, so do not squeeze the tables into 80 columns.
        console = Console(highlight=False, width=140)
    layout = Layout(root)
    # SIGINT too: a shell starting the demo in the background hands it SIGINT ignored, and Ctrl-C
    # (or kill -INT) must still stop everything.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    status = 1
    demo: Demo | None = None
    try:
        with exclusive(root):
            leftovers = fresh_state_dir(layout)
            for line in leftovers:
                console.print(f"stopped a leftover of an earlier run: {line}", style="yellow")
            demo = Demo(args=args, console=console, layout=layout, procs=Supervisor(marker=str(root)))
            demo.say(f"nodetaskd demo: {args.nodes} edges, 2 hubs, 1 controller; state and logs in {root}")
            try:
                run(demo)
                status = 0
            except KeyboardInterrupt:
                console.print("\ninterrupted: stopping everything", style="bold yellow")
                status = 130
            except (DemoError, ApiFailure, _cp.ControlPlaneError) as exc:
                console.print(f"demo failed: {exc}", style="bold red", highlight=False)
            finally:
                # A second Ctrl-C must not cut the tear-down short and leave processes behind.
                for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    signal.signal(signum, signal.SIG_IGN)
                left = demo.stop()
            if left:
                console.print("processes left behind:\n  " + "\n  ".join(left), style="bold red")
                status = status or 1
            else:
                demo.say(f"stopped: no process of the demo is left (logs and configs kept in {root})")
    except DemoError as exc:
        console.print(f"demo failed: {exc}", style="bold red", highlight=False)
    except KeyboardInterrupt:
        # Before anything was started (while wiping the previous run's state).
        status = 130
    if args.summary_json and demo is not None:
        _write_summary(args.summary_json, demo, status)
    return status


def _write_summary(path: Path, demo: Demo, status: int) -> None:
    summary = {
        "status": status,
        "runtime": demo.runtime_line(),
        "runtimeProblem": demo.runtime_problem,
        "unfinished": demo.unfinished,
        "diagnosis": diag.as_json(demo.diagnosis),
        "autonomy": autonomy.as_json(demo.cut_off, demo.nodes_autonomy),
        "hubs": [dataclasses.asdict(hub) for hub in demo.hub_states],
        "jobs": [
            {
                "kind": j.kind,
                "name": j.name,
                "phase": j.phase,
                "reason": j.reason,
                "counts": dict(j.counts),
                "run": j.run,
                "nodes": [
                    {
                        "name": n.name,
                        "phase": n.phase,
                        "reason": n.reason,
                        "lastAction": n.last_action,
                        "attempt": n.attempt,
                        "previousAttempt": None if n.previous is None else dataclasses.asdict(n.previous),
                    }
                    for n in j.nodes
                ],
            }
            for j in demo.jobs
        ],
    }
    path.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
