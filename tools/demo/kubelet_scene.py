"""The demo's kubelet scene, on a real node: a NodeUpgradeJob with ``component: kubelet`` upgrades one device's
kubelet to another build of the same source, paused for a canary confirmation that ``nodetaskd ctl confirm``
gives; the agent swaps the binary, restarts the kubelet under its supervisor and judges it by its healthz and
its Node. ``kubectl get nodes -o wide`` before and after, and whether the device's pod ran throughout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Final

from schemas.core import EDGE_ROLE_LABEL
from tools.demo import devices as dev
from tools.demo.bringup import KUBELET_VERSION
from tools.demo.state import Demo
from tools.provision import controlplane as _cp
from tools.provision import kubebuild

JOB: Final = "kubelet-canary"
BRING_UP_LIMIT: Final = 240.0
LIMIT: Final = 240.0
"""Longest the scene waits for the pause, then for the end."""


def upgrade_kubelet(demo: Demo) -> None:
    """The scene; records what it saw in the devices' view (or why it did not run)."""
    devices = demo.devices
    if devices is None or demo.cp is None:
        return
    with demo.console.status("waiting for the real nodes' bring-up"):
        over = devices.join(BRING_UP_LIMIT)
    if not over or devices.view.problem:
        devices.view.kubelet = {"problem": devices.view.problem or "the real nodes' bring-up did not end in time"}
        return
    cp = demo.cp
    node = dev.NAMES[1]
    before = _wide(cp)
    container = _container(cp, node)
    spec = {
        "nodeNames": [node],
        "version": KUBELET_VERSION,
        "component": "kubelet",
        "requireConfirmation": True,
        "timeoutSeconds": int(LIMIT),
    }
    manifest = {
        "apiVersion": "operations.kubeedge.io/v1alpha2",
        "kind": "NodeUpgradeJob",
        "metadata": {"name": JOB},
        "spec": spec,
    }
    # Node jobs act on edge nodes only (KubeEdge's rule): the operator marks the device as one.
    cp.kubectl("label", "node", node, f"{EDGE_ROLE_LABEL}=", "--overwrite")
    started = time.monotonic()
    cp.kubectl("create", "-f", "-", input=json.dumps(manifest))
    demo.say(
        f"kubelet upgrade: {node} labelled an edge node ({EDGE_ROLE_LABEL}); NodeUpgradeJob {JOB} (component:"
        f" kubelet, requireConfirmation) for it"
    )
    if _until(lambda: _paused(cp) or _final(cp)) and _paused(cp):
        admin = demo.layout.cluster / "admin.kubeconfig"
        command = [sys.executable, "-m", "roles.cli", "ctl", "confirm", JOB, node, f"--kubeconfig={admin}"]
        confirmed = subprocess.run(command, capture_output=True, text=True, check=False)
        answer = " ".join((confirmed.stdout + confirmed.stderr).split())
        demo.say(f"{node} paused at WaitingConfirmation; nodetaskd ctl confirm {JOB} {node} -> {answer}", "cyan")
    _until(lambda: _final(cp))
    job = dev.get(cp, "nodeupgradejob", JOB) or {}
    entry = (job.get("status", {}).get("nodeStatus") or [{}])[0]
    devices.view.kubelet = {
        "job": JOB,
        "node": node,
        "from": f"v{kubebuild.KUBERNETES_VERSION}",
        "to": KUBELET_VERSION,
        "phase": job.get("status", {}).get("phase", "(none)"),
        "reason": entry.get("reason", ""),
        "seconds": time.monotonic() - started,
        "version": _version(cp, node),
        "podKept": bool(container) and _container(cp, node) == container,
        "before": before,
        "after": _wide(cp),
    }
    demo.say(
        f"kubelet upgrade {JOB}: {devices.view.kubelet['phase']}; {node}'s Node reports kubelet"
        f" {devices.view.kubelet['version']}"
    )


def _final(cp: _cp.ControlPlane) -> bool:
    job = dev.get(cp, "nodeupgradejob", JOB) or {}
    return job.get("status", {}).get("phase") in ("Completed", "Failure")


def _paused(cp: _cp.ControlPlane) -> bool:
    job = dev.get(cp, "nodeupgradejob", JOB) or {}
    flows = [entry.get("actionFlow") or [] for entry in job.get("status", {}).get("nodeStatus") or []]
    return any(flow and flow[-1].get("action") == "WaitingConfirmation" for flow in flows)


def _until(probe: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + LIMIT
    while not probe():
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)
    return True


def _version(cp: _cp.ControlPlane, node: str) -> str:
    found = dev.get(cp, "node", node) or {}
    return str(found.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", ""))


def _container(cp: _cp.ControlPlane, device: str) -> str:
    """The device's web pod's container ID: the same one before and after means it ran throughout."""
    found = dev.pod(cp, device) or {}
    statuses = found.get("status", {}).get("containerStatuses") or [{}]
    return str(statuses[0].get("containerID", ""))


def _wide(cp: _cp.ControlPlane) -> str:
    """``kubectl get nodes -o wide`` of the devices: name, status and version columns."""
    shown = cp.kubectl("get", "nodes", *dev.NAMES, "-o", "wide", check=False).stdout
    return "\n".join(" ".join(line.split()[:5]) for line in shown.splitlines())
