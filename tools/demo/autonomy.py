"""The demo's autonomy step: one edge goes on answering from its cache while its hub is cut off.

That edge (:attr:`tools.demo.fleet.Edge.local_api_port`) runs with its local API on and lists only
its own hub, so stopping that hub cuts it off (the other edges of the hub move to the other one).
The step asks autonomy for its Node, gives it a ConfigMap and a Pod bound to it (no kubelet runs:
the Pod exists in the API server only), waits until the device's local API serves them and the
controller has approved the Node, stops the hub, and runs the demo's kubectl against the device.
The summary then shows every Node's ``Autonomy`` condition and approval label.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from nodetask.autonomy import AUTONOMY_ANNOTATION, CONDITION_TYPE, STATUS_LABEL
from tools.demo.kube import Api

NAMESPACE: Final = "default"
CONFIG_MAP: Final = "demo-app-config"
POD: Final = "demo-app"


def app_manifest(node: str) -> dict[str, Any]:
    """A ConfigMap and a Pod bound to ``node`` that mounts it, as one List for ``kubectl apply``."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
        "data": {"greeting": "served from the device's cache"},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": NAMESPACE, "labels": {"app": POD}},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": "registry.invalid/demo-app:1"}],
            "volumes": [{"name": "config", "configMap": {"name": CONFIG_MAP}}],
        },
    }
    return {"apiVersion": "v1", "kind": "List", "items": [config_map, pod]}


def request_autonomy(api: Api, node: str) -> None:
    """Annotate ``node`` as OpenYurt's users do: ``node.beta.openyurt.io/autonomy: "true"``."""
    body = {"metadata": {"annotations": {AUTONOMY_ANNOTATION: "true"}}}
    api.request("PATCH", f"/api/v1/nodes/{node}", body, patch=True)


@dataclass(frozen=True)
class NodeAutonomy:
    """One Node's Autonomy condition (empty when it has none) and the controller's approval label."""

    name: str
    status: str
    reason: str
    label: str

    def line(self) -> str:
        condition = f"{self.status} ({self.reason})" if self.status else "(no condition)"
        return f"{self.name}: Autonomy {condition}, {STATUS_LABEL}={self.label or '(none)'}"


def node_autonomy(api: Api) -> list[NodeAutonomy]:
    """Every Node's Autonomy condition and label, by name."""
    found = []
    for node in api.get("/api/v1/nodes")["items"]:
        conditions = (node.get("status") or {}).get("conditions") or ()
        condition: dict[str, Any] = next((c for c in conditions if c.get("type") == CONDITION_TYPE), {})
        found.append(
            NodeAutonomy(
                name=node["metadata"]["name"],
                status=condition.get("status", ""),
                reason=condition.get("reason", ""),
                label=(node["metadata"].get("labels") or {}).get(STATUS_LABEL, ""),
            )
        )
    return sorted(found, key=lambda n: n.name)


def approved(api: Api, node: str) -> bool:
    """``node``'s condition is True and the controller has labelled it ``true``."""
    mine = next((n for n in node_autonomy(api) if n.name == node), None)
    return mine is not None and (mine.status, mine.label) == ("True", "true")


def local_status(port: int, path: str) -> int:
    """The HTTP status of a GET of ``path`` on the device's local API (0: it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def app_cached(port: int) -> bool:
    """The device's local API serves the app's ConfigMap and Pod."""
    paths = (f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CONFIG_MAP}", f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}")
    return all(local_status(port, path) == 200 for path in paths)


def local_kubectl(kubectl: Path, port: int, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``kubectl --server=http://127.0.0.1:<port>`` as a program on the device would, with no kubeconfig."""
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(home / "none")}
    argv = [str(kubectl), f"--server=http://127.0.0.1:{port}", f"--cache-dir={home / 'cache'}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)


@dataclass(frozen=True)
class AutonomyView:
    """What the step showed: which edge was cut off from which hub, and what kubectl read from it."""

    node: str
    hub: str
    port: int
    command: str
    answer: str
    """The line of kubectl's output about the app's Pod (empty: kubectl failed; ``error`` says why)."""
    error: str = ""


def pod_line(output: str) -> str:
    """The line of a ``kubectl get pods`` table that shows the app's Pod; empty when there is none."""
    return next((line for line in output.splitlines() if POD in line.split()), "")


def summary_lines(view: AutonomyView | None, nodes: list[NodeAutonomy]) -> list[str]:
    """The summary's autonomy part: the cut-off edge's answer, then each Node's condition and label."""
    lines = []
    if view is not None:
        if view.answer:
            lines.append(f"autonomy: {view.node} answered with {view.hub} stopped: $ {view.command}")
            lines.append(f"  {view.answer}")
        else:
            lines.append(f"autonomy: {view.node} did not answer with {view.hub} stopped: {view.error}")
    lines.extend(n.line() for n in nodes)
    return lines


def as_json(view: AutonomyView | None, nodes: list[NodeAutonomy]) -> dict[str, Any]:
    """The summary's autonomy part for ``--summary-json``."""
    return {
        "cut": None
        if view is None
        else {"node": view.node, "hub": view.hub, "command": view.command, "answer": view.answer, "error": view.error},
        "nodes": {n.name: {"status": n.status, "reason": n.reason, "label": n.label} for n in nodes},
    }
