"""Benchmark 4: the resident memory of one edge agent, idle and while it pulls an image.

The agent is the real edge role (``python -m roles.cli --role=edge``) in its own process, run as a
device runs it: by an interpreter whose virtualenv holds only the base install's dependencies
(:func:`bench.edge_device.device_python`; no cloud or demo extra), with its SQLite store and a real containerd (CRI)
on loopback, pulling from a real registry. Its hub is a
minimal one in this process (:class:`bench.edge_hub.MinimalHub`): the real wire codec over trio-websocket and TLS (a
generated CA, which the agent trusts through ``caFile``, as a device trusts its cloud's), answering
the Hello, echoing heartbeats and acknowledging reports, so that nothing else in the agent's
process is measured. For each run, a fresh agent:

1. connects and is welcomed; after ``settle_s`` its memory is read three times, a second apart
   (RSS, USS and PSS from ``/proc/<pid>/smaps``; the median of each): *idle*;
2. the hub sends an ImagePrePullJob's RunAction (Check, then Pull of an image of ``layer_mib``
   MiB that no run has pulled before); RSS is sampled every 20 ms until the Pull report: *peak*,
   of the agent alone and with its children (the pull runs in a child, see
   :mod:`roles.edge.runtime.puller`);
3. ``settle_s`` later, memory again: *idle after a pull* (what the pull's imports and buffers left).

Also measured: the launcher (``python -m roles.edge.launcher``, which supervises the agent on a
device) with an idle agent under it, and, each in a fresh interpreter, what importing the agent's
parts costs, to show where an idle agent's memory goes.
"""

from __future__ import annotations

import secrets
import statistics
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psutil

from bench.cluster import REPO
from bench.edge_device import (
    NODE,
    Memory,
    agent_config,
    device_process,
    device_python,
    repo_env,
    rss_with_children,
    settled_memory,
)
from bench.edge_hub import MinimalHub, serving
from bench.local_api import list_latency, realistic_pod
from bench.waits import Stalled, deadline
from nodetask import messages
from tools.ports import free_port
from tools.processes import role_command
from tools.provision.containerd import Containerd, Registry, ensure_tools, start_containerd, start_registry

SAMPLE_S = 0.02

IMPORT_STEPS: tuple[tuple[str, str], ...] = (
    ("the interpreter", "pass"),
    ("+ trio, anyio", "import trio, anyio"),
    ("+ trio-websocket", "import trio_websocket"),
    ("+ structlog", "import structlog"),
    ("+ msgspec, sqlite3", "import msgspec, sqlite3"),
    ("+ the agent (roles.edge.role): an idle agent", "import roles.edge.role, roles.cli.main"),
    ("+ psutil (loaded by the first Check)", "import roles.edge.checks.host"),
    ("+ the registry client (loaded by the first upgrade)", "import roles.edge.upgrade.artifact"),
    ("+ grpcio and the CRI client (only in the puller's child)", "import roles.edge.runtime.cri"),
)
"""Cumulative imports, each row in a fresh interpreter with the rows above it."""


@dataclass(frozen=True, slots=True)
class FootprintRun:
    idle: Memory
    peak_rss: int
    """The agent's own RSS at its highest during the pull."""
    peak_total_rss: int
    """The agent's and its children's (the image puller's) RSS together at their highest."""
    after_pull: Memory
    pull_s: float
    layer_bytes: int


@dataclass(frozen=True, slots=True)
class LauncherRun:
    launcher: Memory
    """The launcher's own memory while its agent is idle."""
    agent: Memory
    """The idle agent it started (no container runtime configured)."""


@dataclass(frozen=True, slots=True)
class ImportStep:
    what: str
    rss: int


async def _one_run(
    python: Path, ctd: Containerd, registry: Registry, *, index: int, layer: bytes, settle_s: float
) -> FootprintRun:
    image = registry.push("bench/footprint", f"run{index}-{secrets.token_hex(4)}", content=layer)
    hub = MinimalHub(image=image)
    with tempfile.TemporaryDirectory(prefix="ntd-edge-") as tmp:
        async with serving(hub, Path(tmp)) as (port, ca_file):
            config = agent_config(Path(tmp), port=port, cri_endpoint=ctd.endpoint, ca_file=ca_file)
            argv = (*role_command("edge", config, python=python), "--log-level=warning")
            async with device_process(*argv) as process:
                with deadline("the agent's Hello", 60):
                    await hub.welcomed.wait()
                await anyio.sleep(settle_s)
                idle = await settled_memory(process.pid)
                peak = peak_total = 0
                agent = psutil.Process(process.pid)
                started = time.perf_counter()
                hub.start_pull.set()
                with deadline("the agent's pull report", 300):
                    while not hub.pulled.is_set():
                        own, children = rss_with_children(agent)
                        peak, peak_total = max(peak, own), max(peak_total, own + children)
                        with anyio.move_on_after(SAMPLE_S):
                            await hub.pulled.wait()
                pull_s = time.perf_counter() - started
                report = hub.pull_report
                if report is None or not report.succ:
                    raise RuntimeError(f"the pull failed: {report.reason if report else 'no report'}")
                await anyio.sleep(settle_s)
                after = await settled_memory(process.pid)
    return FootprintRun(
        idle=idle, peak_rss=peak, peak_total_rss=peak_total, after_pull=after, pull_s=pull_s, layer_bytes=len(layer)
    )


async def run(*, runs: int = 3, settle_s: float = 5.0, layer_mib: int = 32) -> list[FootprintRun]:
    """``runs`` fresh agents, each measured idle, during a pull and after it."""
    tools = ensure_tools()
    python = device_python()
    results: list[FootprintRun] = []
    # Short paths: containerd's socket must fit in a unix socket address.
    with tempfile.TemporaryDirectory(prefix="ntd-fp-", dir="/tmp") as tmp:
        ctd = start_containerd(Path(tmp) / "ctd", tools)
        try:
            registry = start_registry(Path(tmp) / "reg", tools)
            try:
                ctd.allow_plain_http(registry.host)
                for index in range(runs):
                    layer = secrets.token_bytes(layer_mib << 20)
                    results.append(await _one_run(python, ctd, registry, index=index, layer=layer, settle_s=settle_s))
            finally:
                registry.stop()
        finally:
            ctd.stop()
    return results


async def launcher_run(*, settle_s: float = 5.0) -> LauncherRun:
    """A launcher supervising a fresh agent: both processes' memory ``settle_s`` after the agent's Welcome."""
    python = device_python()
    hub = MinimalHub(image="")
    with tempfile.TemporaryDirectory(prefix="ntd-launcher-") as tmp:
        async with serving(hub, Path(tmp)) as (port, ca_file):
            config = agent_config(Path(tmp), port=port, cri_endpoint="", ca_file=ca_file)
            async with device_process(str(python), "-m", "roles.edge.launcher", f"--config={config}") as process:
                with anyio.fail_after(60):
                    await hub.welcomed.wait()
                await anyio.sleep(settle_s)
                (agent,) = psutil.Process(process.pid).children()
                launcher = await settled_memory(process.pid)
                idle_agent = await settled_memory(agent.pid)
    return LauncherRun(launcher=launcher, agent=idle_agent)


@dataclass(frozen=True, slots=True)
class CacheRun:
    local_api: bool
    metrics: bool
    """The agent's metrics on, and scraped once before its memory is read."""
    idle: Memory
    """Memory ``settle_s`` after the cache was filled (the condition True), with no list asked for."""
    list_pods: dict[str, float] | None = None
    """With the local API: latencies (ms) of ``GET`` the node's Pods from the agent's durable cache."""


def cache_frames() -> tuple[messages.CacheObjects, ...]:
    """A hub's relist of a node with 10 realistic Pods (about 4 KiB of JSON each) and one ConfigMap."""

    def relist(kind: str, *items: dict[str, Any]) -> messages.CacheObjects:
        raw = tuple(msgspec.Raw(msgspec.json.encode(item)) for item in items)
        return messages.CacheObjects(kind=kind, objects=raw, replace=True, resource_version="200")

    config_map = {"metadata": {"name": "web-config", "namespace": "default", "resourceVersion": "150"}}
    return (
        relist("Node", {"metadata": {"name": NODE, "resourceVersion": "1"}}),
        relist("Pod", *(realistic_pod(i) for i in range(10))),
        relist("ConfigMap", {**config_map, "data": {"mode": "edge"}}),
    )


async def cache_run(*, local_api: bool, metrics: bool = False, settle_s: float = 5.0, requests: int = 1000) -> CacheRun:
    """A fresh agent (no container runtime) whose hub fills its cache: its idle memory with the local API
    on or off (and its metrics on or off), and with the local API on, how fast it lists the node's Pods from
    that cache over HTTP."""
    python = device_python()
    hub = MinimalHub(image="", cache=cache_frames())
    api_port = free_port() if local_api else None
    metrics_port = free_port() if metrics else None
    with tempfile.TemporaryDirectory(prefix="ntd-cache-") as tmp:
        async with serving(hub, Path(tmp)) as (port, ca_file):
            config = agent_config(
                Path(tmp), port=port, cri_endpoint="", ca_file=ca_file, local_api_port=api_port,
                metrics_port=metrics_port,
            )  # fmt: skip
            argv = (*role_command("edge", config, python=python), "--log-level=warning")
            async with device_process(*argv) as process:
                with deadline("the agent's Autonomy condition", 60):
                    await hub.autonomous.wait()
                if metrics_port is not None:
                    await anyio.to_thread.run_sync(_scrape, metrics_port)
                await anyio.sleep(settle_s)
                idle = await settled_memory(process.pid)
                latency = None if api_port is None else await list_latency(api_port, requests)
    return CacheRun(local_api=local_api, metrics=metrics, idle=idle, list_pods=latency)


def _scrape(port: int) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        if b"nodetaskd_edge_hub_connected 1.0" not in answer.read():
            raise Stalled("the agent's metrics do not show its hub session")


def import_costs() -> list[ImportStep]:
    """The RSS of fresh interpreters (of the device virtualenv) importing the agent's parts cumulatively."""
    python = device_python()
    steps: list[ImportStep] = []
    imported: list[str] = []
    probe = "import resource, re; print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1])"
    for what, statement in IMPORT_STEPS:
        imported.append(statement)
        readings = []
        for _ in range(3):
            out = subprocess.run(
                [str(python), "-c", "; ".join([*imported, probe])],
                cwd=REPO, env=repo_env(), check=True, capture_output=True, text=True,
            )  # fmt: skip
            readings.append(int(out.stdout.strip()) * 1024)
        steps.append(ImportStep(what=what, rss=int(statistics.median(readings))))
    return steps
