"""The hub under measurement as a process of its own (the real cloud role through :mod:`bench.hubproc`):
its config, the ports it bound, its readiness, and its metrics, read and waited on.

Shared by the hub capacity series (:mod:`bench.hub_capacity`) and its cache-stream variant (:mod:`bench.hub_cache`).
"""

from __future__ import annotations

import re
import resource
import urllib.request
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc
import psutil

from bench.waits import Stalled, until_count
from roles.cloud.transport.ingress import connection_limits
from tools.processes import NotReady, until_ports, until_ready
from tools.provision.controlplane import ControlPlane

HEARTBEAT_S = 15.0
"""The hubs' heartbeat interval in these series (the role's default)."""
_SAMPLE = re.compile(r'^(\w+)(?:\{(\w+)="([^"]*)"\})? ([0-9.e+-]+)$')
MARKS = "nodetaskd_hub_node_marks_total"
"""Node marks settled, by outcome (``written``, ``skipped``, ``failed``)."""
MANY_SESSIONS_HANDSHAKES = 500
"""``maxHandshakes`` when ``maxSessions`` is raised to the fleet's size (see :func:`_limits`)."""


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            name, _, label, value = m.groups()
            out[f"{name}:{label}" if label else name] = float(value)
    return out


async def read_metrics(port: int) -> dict[str, float]:
    """The hub's metrics on ``port``, by sample name (``name:label`` for a labelled one)."""
    return await anyio.to_thread.run_sync(_metrics, port)


async def bound_ports(ports_file: Path, process: anyio.abc.Process) -> dict[str, int]:
    """The ports a hub started on port 0 wrote to its ``portsFile``, by setting (``listen``, ``httpListen``)."""
    try:
        return await until_ports(process, ports_file, limit_s=60)
    except NotReady as exc:
        raise Stalled(f"the hub {exc}") from None


async def hub_ready(port: int, process: anyio.abc.Process) -> None:
    """Once the hub answers /readyz on ``port``; Stalled if it does not within a minute or ends."""
    try:
        await until_ready(process, f"http://127.0.0.1:{port}/readyz", limit_s=60)
    except NotReady as exc:
        raise Stalled(f"the hub {exc}") from None


def write_config(
    cp: ControlPlane,
    path: Path,
    *,
    hub_id: str,
    port: int,
    http_port: int,
    cache_streams: bool = False,
    log_level: str = "error",
    sessions: int = 0,
    ports_file: Path | None = None,
) -> None:
    """Write the hub's config to ``path``: this series' heartbeat, loopback ports (0: the hub picks, and writes
    them to ``ports_file``) and, for a fleet past the session cap its file limit gives, the limits raised."""
    # By default sessions alone, as before cache streams existed (bench/hub_cache.py turns them on).
    ports = f"portsFile: {ports_file}\n" if ports_file else ""
    path.write_text(
        _limits(sessions) + ports + f"kubeconfig: {cp.kubeconfig('cloud')}\n"
        f"hubId: {hub_id}\n"
        f"listen: 127.0.0.1:{port}\n"
        f"httpListen: 127.0.0.1:{http_port}\n"
        f"heartbeatInterval: {HEARTBEAT_S}\n"
        f"cacheStreams: {'true' if cache_streams else 'false'}\n"
        "closeGrace: 2\n"
        f"logLevel: {log_level}\n"
    )


def _limits(sessions: int) -> str:
    """Config lines for a fleet past the session cap the hub derives from its file limit (a quarter of the
    limit kept for handshakes): what an operator holding that many edges on one process sets."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # the hub raises its soft limit to this
    if hard == resource.RLIM_INFINITY or sessions <= connection_limits(hard).sessions:
        return ""
    return f"maxSessions: {sessions}\nmaxHandshakes: {MANY_SESSIONS_HANDSHAKES}\n"


def marks_settled(metrics: dict[str, float]) -> float:
    """Node marks settled, whatever their outcome."""
    return sum(value for key, value in metrics.items() if key.startswith(f"{MARKS}:"))


async def wait_metric(
    what: str, port: int, key: str | Callable[[dict[str, float]], float], target: float, limit_s: float
) -> dict[str, float]:
    """The hub's metrics once ``key`` (a sample, or a function of them all) reaches ``target``; Stalled
    naming ``what`` after ``limit_s`` seconds."""
    latest: dict[str, float] = {}

    async def count() -> float:
        nonlocal latest
        latest = await read_metrics(port)
        return key(latest) if callable(key) else latest.get(key, 0.0)

    await until_count(what, count, target, limit_s=limit_s, interval_s=0.1)
    return latest


def psutil_nofile(pid: int) -> tuple[int, int]:
    soft, hard = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)
    return int(soft), int(hard)
