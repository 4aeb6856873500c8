"""The agent as a device runs it, for the edge footprint (:mod:`bench.edge_footprint`): an interpreter with
the base install's dependencies only, this repository's code, a config pointing at the benchmark's hub,
and its memory as ``/proc`` reads it (RSS, USS, PSS)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
import psutil

from bench.cluster import REPO
from tools.processes import terminate

NODE = "bench-edge"
"""The Node the measured agent runs as."""


@dataclass(frozen=True, slots=True)
class Memory:
    """A process's memory in bytes: resident, unique to it, and its proportional share."""

    rss: int
    uss: int
    pss: int


def device_python() -> Path:
    """The interpreter of a virtualenv with only the base dependencies, built once per dependency list.

    Only the installed libraries are a device's; the package itself is installed editable (without
    dependencies) for its metadata, which the agent reads its version from. The virtualenv is shared
    by every checkout on the machine, so its editable install may point at another one (or at one
    since removed): every process is therefore started with this repository first on its path
    (:func:`repo_env`), and the measurement follows this repository's code.
    """
    deps: list[str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    constraints = REPO / "constraints.txt"
    # The metadata gives ranges; the versions a device gets are the ones the project was seen working with.
    key = hashlib.sha256("\n".join([*sorted(deps), constraints.read_text()]).encode()).hexdigest()[:12]
    venv = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nodetaskd" / f"edge-venv-{key}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "--constraint", str(constraints), *deps], check=True)
        subprocess.run([*pip, "--no-deps", "--editable", str(REPO)], check=True)
        (venv / ".complete").touch()
    return python


def repo_env() -> dict[str, str]:
    """The environment with this repository first on ``PYTHONPATH``, which also reaches an agent the launcher
    starts with ``-P`` (its working directory off ``sys.path``)."""
    paths = [str(REPO), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


@contextlib.asynccontextmanager
async def device_process(*argv: str) -> AsyncIterator[anyio.abc.Process]:
    """``argv`` run with this repository's code (:func:`repo_env`), output dropped; stopped at the end."""
    process = await anyio.open_process(
        list(argv), cwd=REPO, env=repo_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield process
    finally:
        await terminate(process)
        await process.aclose()


def agent_config(
    home: Path,
    *,
    port: int,
    cri_endpoint: str,
    ca_file: Path,
    local_api_port: int | None = None,
    metrics_port: int | None = None,
) -> Path:
    (home / "token").write_text("bench-token\n")
    config: dict[str, Any] = {
        "nodeName": NODE,
        "hubUrls": [f"wss://127.0.0.1:{port}/nodes/{NODE}"],
        "caFile": str(ca_file),
        "tokenFile": str(home / "token"),
        "dataDir": str(home / "data"),
        "criEndpoint": cri_endpoint,
        "maxCpuUsage": 100,
        "maxMemUsage": 100,
        "maxDiskUsage": 100,
    }
    if local_api_port is not None:
        config["localApi"] = {"enabled": True, "port": local_api_port}
    if metrics_port is not None:
        config["metrics"] = {"enabled": True, "port": metrics_port}
    path = home / "edge.yaml"
    path.write_bytes(msgspec.yaml.encode(config))
    return path


def rss_with_children(process: psutil.Process) -> tuple[int, int]:
    """The RSS of ``process``, and of its children together (one that just ended counts 0)."""
    own = int(process.memory_info().rss)
    children = 0
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            children += int(child.memory_info().rss)
    return own, children


def _memory(pid: int) -> Memory:
    info = psutil.Process(pid).memory_full_info()
    return Memory(rss=info.rss, uss=info.uss, pss=info.pss)


async def settled_memory(pid: int) -> Memory:
    readings = []
    for _ in range(3):
        readings.append(_memory(pid))
        await anyio.sleep(1)
    return Memory(
        rss=int(statistics.median(r.rss for r in readings)),
        uss=int(statistics.median(r.uss for r in readings)),
        pss=int(statistics.median(r.pss for r in readings)),
    )
