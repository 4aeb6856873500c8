"""Helpers for tests on real nodes (a kubelet and containerd of ``tools/provision/node.py``): waiting for
a Node or a pod to get somewhere, reading them as admin, and what a pod's web server answers."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.integration.controlplane import ControlPlane
from tools.provision import node_images

T = TypeVar("T")
LIMIT_S = 90.0
"""How long a node or a pod may take to get where the test waits for it (a loaded 2-core machine)."""


def until(what: str, probe: Callable[[], T | None], limit_s: float = LIMIT_S) -> T:
    """The first value ``probe()`` gives that is not None; fails naming ``what`` after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while (value := probe()) is None:
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not after {limit_s:g} s")
        time.sleep(0.5)
    return value


def get(cp: ControlPlane, *args: str) -> dict[str, Any] | None:
    """An object as admin, or None when the API has none."""
    result = cp.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def ready_node(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    node = get(cp, "node", name)
    conditions = node["status"].get("conditions", []) if node else []
    return node if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None


def serving_pod(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod once its web container runs, is ready and its pod IP answers (with what it answered)."""
    pod = get(cp, "pod", "-n", namespace, name)
    if pod is None or pod["status"].get("phase") != "Running" or not pod["status"].get("podIP"):
        return None
    statuses = pod["status"].get("containerStatuses", [])
    if not statuses or not all(s.get("ready") for s in statuses):
        return None
    page = fetch(pod)
    return {**pod, "page": page} if page is not None else None


def fetch(pod: dict[str, Any]) -> str | None:
    """What the pod's web server answers at / from this machine (host to pod IP, through the node's bridge)."""
    try:
        url = f"http://{pod['status']['podIP']}:{node_images.WEB_PORT}/"
        with urllib.request.urlopen(url, timeout=2) as answer:
            return str(answer.read().decode())
    except OSError:
        return None


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed container's process waits for this
    machine's init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def create(cp: ControlPlane, namespace: str, manifest: dict[str, Any]) -> None:
    cp.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(manifest))
