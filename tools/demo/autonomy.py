"""The demo's autonomy step: one edge goes on answering from its cache while its hub is cut off.

That edge (:attr:`tools.demo.fleet.Edge.local_api_port`) runs with its local API on and lists only
its own hub, so stopping that hub cuts it off (the other edges of the hub move to the other one).
The step asks autonomy for its Node, gives it a ConfigMap and a Pod bound to it (no kubelet runs:
the Pod exists in the API server only), waits until the device's local API serves them and the
controller has approved the Node, stops the hub, and runs the demo's kubectl against the device.
Then it changes the ConfigMap in the cloud, which the device cannot hear of, and starts the hub
again on its ports: the edge reconnects (its log says ``hub_connected``), the hub relists its
node's objects (``cache_relisted``), and the device's local API serves the change.
The summary then shows that return and every Node's ``Autonomy`` condition and approval label.
"""

from __future__ import annotations

import dataclasses
import json
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
GREETING: Final = "served from the device's cache"
CHANGED_GREETING: Final = "changed in the cloud while the device was cut off"
RECONNECTED: Final = "hub_connected"
"""What the edge agent logs once a hub has welcomed it (``roles/edge/session.py``)."""
RELISTED: Final = "cache_relisted"
"""What it logs once the hub has relisted every kind its cache takes (``roles/edge/cache/autonomy_manager.py``)."""


def app_manifest(node: str) -> dict[str, Any]:
    """A ConfigMap and a Pod bound to ``node`` that mounts it, as one List for ``kubectl apply``."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
        "data": {"greeting": GREETING},
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
    """One Node's Autonomy condition (empty when it has none), the controller's approval label, and the
    status of its Ready condition."""

    name: str
    status: str
    reason: str
    label: str
    ready: str = ""

    def line(self) -> str:
        condition = f"{self.status} ({self.reason})" if self.status else "(no condition)"
        return f"{self.name}: Autonomy {condition}, {STATUS_LABEL}={self.label or '(none)'}"


def node_autonomy(api: Api) -> list[NodeAutonomy]:
    """Every Node's Autonomy condition and label, by name."""
    found = []
    for node in api.get("/api/v1/nodes")["items"]:
        conditions = (node.get("status") or {}).get("conditions") or ()
        condition: dict[str, Any] = next((c for c in conditions if c.get("type") == CONDITION_TYPE), {})
        ready = next((c.get("status", "") for c in conditions if c.get("type") == "Ready"), "")
        found.append(
            NodeAutonomy(
                name=node["metadata"]["name"],
                status=condition.get("status", ""),
                reason=condition.get("reason", ""),
                label=(node["metadata"].get("labels") or {}).get(STATUS_LABEL, ""),
                ready=ready,
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


def local_greeting(port: int) -> str:
    """The greeting in the app's ConfigMap as the device's local API serves it (empty: it does not)."""
    url = f"http://127.0.0.1:{port}/api/v1/namespaces/{NAMESPACE}/configmaps/{CONFIG_MAP}"
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            config_map = json.loads(answer.read())
    except (OSError, ValueError):
        return ""
    return str((config_map.get("data") or {}).get("greeting", ""))


def greeting_change() -> str:
    """The merge patch (``kubectl patch --type=merge -p``) that changes the app's greeting."""
    return json.dumps({"data": {"greeting": CHANGED_GREETING}})


def log_line(log: Path, offset: int, event: str, *fields: str) -> str:
    """The first line past byte ``offset`` of a role's log (console format) that is ``event`` with each of
    ``fields`` (``key=value``), whitespace squeezed; empty when there is none yet."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        words = line.split()
        if event in words and all(field in words for field in fields):
            return " ".join(words)
    return ""


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
class HubReturn:
    """The cut-off edge once its hub was started again: the lines of its log that say it reconnected and
    relisted (empty: not within the wait), and the greeting its local API then served."""

    hub: str
    url: str
    reconnected: str
    relisted: str
    greeting: str

    @property
    def complete(self) -> bool:
        return bool(self.reconnected and self.relisted) and self.greeting == CHANGED_GREETING


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
    returned: HubReturn | None = None
    """What followed when the hub was started again (None: it was not)."""


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
        lines.extend(return_lines(view.node, view.returned))
    lines.extend(n.line() for n in nodes)
    return lines


def return_lines(node: str, back: HubReturn | None) -> list[str]:
    """What followed the hub's return (none when it was not started again)."""
    if back is None:
        return []
    lines = [f"autonomy: {back.hub} started again at {back.url}"]
    lines.append(f"  {node} reconnected: {back.reconnected}" if back.reconnected else f"  {node} did NOT reconnect")
    lines.append(f"  its cache relisted: {back.relisted}" if back.relisted else "  its cache was NOT relisted")
    if back.greeting == CHANGED_GREETING:
        lines.append(f"  its local API serves {CONFIG_MAP} as changed in the cloud meanwhile: {back.greeting!r}")
    else:
        lines.append(f"  its local API does NOT serve the change to {CONFIG_MAP}: greeting {back.greeting!r}")
    return lines


def as_json(view: AutonomyView | None, nodes: list[NodeAutonomy]) -> dict[str, Any]:
    """The summary's autonomy part for ``--summary-json``."""
    return {
        "cut": None
        if view is None
        else {
            "node": view.node,
            "hub": view.hub,
            "command": view.command,
            "answer": view.answer,
            "error": view.error,
            "returned": None if view.returned is None else dataclasses.asdict(view.returned),
        },
        "nodes": {n.name: {"status": n.status, "reason": n.reason, "label": n.label, "ready": n.ready} for n in nodes},
    }
