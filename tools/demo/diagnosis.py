"""The demo's diagnosis: the edge-health pipeline of ``containers/samples/diagnosis*.yaml`` over every edge.

Its first path probes an app each edge depends on; the demo plays the world around the edges:

- the fleet's *directory*, an HTTP service on loopback that the ``network`` Operation asks (each
  edge POSTs its request data, which names the node) where the node's app listens;
- the *apps*: one TCP port per node, listening, except on the nodes given as down, whose port is
  bound but does not listen, so a connection to it is refused, as to an app that has crashed.

Both run before the edges start, so that each edge's config can list the two ports its Tasks reach
(``diagnosis.loopbackPorts``: a device's ports are closed to Tasks unless listed).
The edges' ``network.probe`` then fails for real on those nodes (connection refused), path 0 fails,
and path 1 runs ``resources`` on every node. What the summary shows is read back from the Diagnosis
and its Tasks: the failed path, the succeeded one, why the failed nodes failed, and a value that
went from one stage's results into the next stage's request.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec

from tools.demo.kube import Api

GROUP_VERSION: Final = "diagnosis.kubediag.org/v1"
NAMESPACE: Final = "default"
OPERATIONS_SAMPLE: Final = "diagnosis-operations.yaml"
DIAGNOSIS_SAMPLE: Final = "diagnosis.yaml"
DIRECTORY_OPERATION: Final = "network"
"""The Operation that asks the directory; its ``httpServer.port`` is pointed at the demo's directory."""
TARGETS_RESULT: Final = "probe.targets"
"""What the directory answers; the next stage gets it as ``network.probe.targets``."""
UID_LABEL: Final = "diagnosis.kubediag.org/diagnosis-uid"
FINAL_PHASES: Final = frozenset({"Succeeded", "Failed", "Unknown"})
SHOWN_RESULTS: Final = (
    "node.resources.cpu.count",
    "node.resources.load",
    "node.resources.memory.percent",
    "node.resources.uptime.seconds",
)
"""What the summary quotes of the succeeded path's last results on one node, when it has them."""


class Directory:
    """The directory service and the apps, on loopback, until :meth:`stop`."""

    def __init__(self, nodes: Sequence[str], down: Sequence[str]) -> None:
        self.down = tuple(down)
        self.asked: Counter[str] = Counter()
        """Requests per node: the shared stage runs once on each node, whichever paths run."""
        self._apps: dict[str, socket.socket] = {}
        for node in nodes:
            app = socket.socket()
            app.bind(("127.0.0.1", 0))
            if node not in self.down:
                app.listen(16)
            self._apps[node] = app
        directory = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    node = str(json.loads(self.rfile.read(length)).get("node", ""))
                except (ValueError, AttributeError):
                    node = ""
                address = directory.address(node)
                directory.asked[node] += 1
                status, answer = (200, {TARGETS_RESULT: address}) if address else (404, {"error": "unknown node"})
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-directory", daemon=True)
        self._thread.start()

    def loopback_ports(self, node: str) -> tuple[int, ...]:
        """The ports ``node``'s Tasks must reach on loopback (the directory and its app), which its config lists
        in ``diagnosis.loopbackPorts``: a device's ports are closed to Tasks otherwise."""
        app = self._apps.get(node)
        return (self.port, app.getsockname()[1]) if app is not None else (self.port,)

    def address(self, node: str) -> str:
        """Where ``node``'s app listens (or did, for a node whose app is down); empty for another node."""
        app = self._apps.get(node)
        return f"127.0.0.1:{app.getsockname()[1]}" if app is not None else ""

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        for app in self._apps.values():
            app.close()


def render_operations(samples: Path, *, directory_port: int) -> dict[str, Any]:
    """The Operations and OperationSet sample, its directory Operation pointed at ``directory_port``."""
    listing: dict[str, Any] = msgspec.yaml.decode((samples / OPERATIONS_SAMPLE).read_bytes())
    for item in listing["items"]:
        if item["kind"] == "Operation" and item["metadata"]["name"] == DIRECTORY_OPERATION:
            item["spec"]["processor"]["httpServer"]["port"] = directory_port
    return listing


def render_diagnosis(samples: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = msgspec.yaml.decode((samples / DIAGNOSIS_SAMPLE).read_bytes())
    return manifest


def operation_set_ready(api: Api, name: str) -> bool:
    found = api.get(f"/apis/{GROUP_VERSION}/operationsets/{name}")
    return bool((found.get("status") or {}).get("ready"))


def read_diagnosis(api: Api, name: str) -> dict[str, Any]:
    found: dict[str, Any] = api.get(f"/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/diagnoses/{name}")
    return found


def read_tasks(api: Api, uid: str) -> list[dict[str, Any]]:
    found = api.get(f"/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/tasks?labelSelector={UID_LABEL}%3D{uid}")
    items: list[dict[str, Any]] = found["items"]
    return items


def progress(diagnosis: Mapping[str, Any]) -> str:
    """``Running, path 0 stage 2 (3/4 Tasks ended)``, from the status."""
    status = diagnosis.get("status") or {}
    phase = status.get("phase") or "(new)"
    cp = status.get("checkpoint")
    if not cp or phase in FINAL_PHASES:
        return phase
    ended = cp.get("succeeded", 0) + cp.get("failed", 0)
    stage = cp.get("nodeIndex", 0) + 1
    return f"{phase}, path {cp.get('pathIndex', 0)} stage {stage} ({ended}/{cp.get('desired', 0)} Tasks ended)"


@dataclass(frozen=True)
class Failure:
    node: str
    operation: str
    reason: str


@dataclass(frozen=True)
class Propagated:
    """A value of one stage's results on a node, as the node's next stage received it."""

    node: str
    source: str
    """The earlier Operation."""
    result_key: str
    target: str
    """The later Operation."""
    request_key: str
    value: str


@dataclass(frozen=True)
class DiagnosisView:
    """A Diagnosis's end, in the terms the demo's summary shows."""

    name: str
    phase: str
    message: str
    failed_paths: tuple[tuple[str, ...], ...]
    succeeded_path: tuple[str, ...]
    failures: tuple[Failure, ...]
    propagated: Propagated | None
    tasks: int
    asked: Mapping[str, int] = field(default_factory=dict)
    sample: Mapping[str, str] = field(default_factory=dict)
    """A few results of the succeeded path's last stage on one node."""
    sample_node: str = ""


def _path(path: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    return tuple(str(node.get("operation", "")) for node in path)


def _failure_reason(task: Mapping[str, Any]) -> str:
    conditions = (task.get("status") or {}).get("conditions") or []
    failed = [c for c in conditions if c.get("type") == "Failed" and c.get("status") == "True"]
    return str(failed[-1].get("message", "")) if failed else ""


def _propagated(tasks: Sequence[Mapping[str, Any]], *, failed: set[tuple[str, str]]) -> Propagated | None:
    """A value the directory stage's results passed into a later stage's request on the same node, preferring a
    Task that failed (``failed`` holds their node and Operation): its probe went where the directory said."""
    key = f"{DIRECTORY_OPERATION}.{TARGETS_RESULT}"
    results = {
        t["spec"]["nodeName"]: (t.get("status") or {}).get("results") or {}
        for t in tasks
        if t["spec"]["operation"] == DIRECTORY_OPERATION
    }
    found: list[Propagated] = []
    for task in tasks:
        node, operation = task["spec"]["nodeName"], task["spec"]["operation"]
        value = (task["spec"].get("parameters") or {}).get(key)
        if operation != DIRECTORY_OPERATION and value and results.get(node, {}).get(TARGETS_RESULT) == value:
            found.append(Propagated(node, DIRECTORY_OPERATION, TARGETS_RESULT, operation, key, value))
    found.sort(key=lambda p: ((p.node, p.target) not in failed, p.node, p.target))
    return found[0] if found else None


def view(diagnosis: Mapping[str, Any], tasks: Sequence[Mapping[str, Any]], asked: Mapping[str, int]) -> DiagnosisView:
    """What the summary says about ``diagnosis``, from its status and its Tasks."""
    status = diagnosis.get("status") or {}
    complete = [c for c in status.get("conditions") or () if c.get("type") == "Complete"]
    failures = sorted(
        (
            Failure(t["spec"]["nodeName"], t["spec"]["operation"], _failure_reason(t))
            for t in tasks
            if (t.get("status") or {}).get("phase") in ("Failed", "Unknown")
        ),
        key=lambda f: (f.operation, f.node),
    )
    propagated = _propagated(tasks, failed={(f.node, f.operation) for f in failures})
    succeeded = _path(status.get("succeededPath") or ())
    sample: dict[str, str] = {}
    sample_node = ""
    if succeeded:
        last = sorted(
            (t for t in tasks if t["spec"]["operation"] == succeeded[-1]), key=lambda t: t["spec"]["nodeName"]
        )
        for task in last[:1]:
            sample_node = task["spec"]["nodeName"]
            results = (task.get("status") or {}).get("results") or {}
            sample = {k: results[k] for k in SHOWN_RESULTS if k in results}
    return DiagnosisView(
        name=diagnosis["metadata"]["name"],
        phase=status.get("phase", ""),
        message=complete[-1].get("message", "") if complete else "",
        failed_paths=tuple(_path(p) for p in status.get("failedPaths") or ()),
        succeeded_path=succeeded,
        failures=tuple(failures),
        propagated=propagated,
        tasks=len(tasks),
        asked=dict(asked),
        sample=sample,
        sample_node=sample_node,
    )


def _arrow(path: Sequence[str]) -> str:
    return " -> ".join(path) or "(none)"


def _nodes(names: Sequence[str]) -> str:
    return ", ".join(names)


def summary_lines(v: DiagnosisView, *, down: Sequence[str]) -> list[str]:
    """Plain sentences about the diagnosis, each read from the Diagnosis or its Tasks."""
    out = [f"diagnosis {v.name}: {v.phase or '(not started)'}" + (f" ({v.message})" if v.message else "")]
    for index, path in enumerate(v.failed_paths):
        out.append(f"failed path {index}: {_arrow(path)}")
    for reason, nodes in _grouped(v.failures).items():
        out.append(f"  failed on {_nodes(nodes)}: {reason}")
    if v.succeeded_path:
        out.append(f"succeeded path: {_arrow(v.succeeded_path)}")
    if v.sample:
        shown = ", ".join(f"{k}={val}" for k, val in v.sample.items())
        out.append(f"  {v.sample_node}: {shown}")
    if v.propagated is not None:
        p = v.propagated
        out.append(
            f"propagated value: on {p.node}, {p.source}'s result {p.result_key}={p.value} went into"
            f" {p.target}'s request as {p.request_key}"
        )
    if down:
        out.append(f"(the demo's directory gives {_nodes(down)} an app port that refuses connections)")
    shared = [n for n, count in sorted(v.asked.items()) if count == 1]
    if v.failed_paths and shared and len(shared) == len(v.asked):
        out.append(f"{DIRECTORY_OPERATION}, shared by both paths, ran once on each of the {len(shared)} nodes")
    return out


def _grouped(failures: Sequence[Failure]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for f in failures:
        grouped.setdefault(f"{f.operation}: {f.reason}", []).append(f.node)
    return grouped


def as_json(v: DiagnosisView | None) -> dict[str, Any] | None:
    """The summary file's form of the view."""
    if v is None:
        return None
    return {
        "name": v.name,
        "phase": v.phase,
        "message": v.message,
        "failedPaths": [list(p) for p in v.failed_paths],
        "succeededPath": list(v.succeeded_path),
        "failures": [{"node": f.node, "operation": f.operation, "reason": f.reason} for f in v.failures],
        "propagated": None
        if v.propagated is None
        else {
            "node": v.propagated.node,
            "from": v.propagated.source,
            "resultKey": v.propagated.result_key,
            "to": v.propagated.target,
            "requestKey": v.propagated.request_key,
            "value": v.propagated.value,
        },
        "tasks": v.tasks,
        "asked": dict(v.asked),
    }
