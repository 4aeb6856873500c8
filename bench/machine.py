"""What the benchmarks ran on: CPU, cores, memory, kernel, Python and the pinned libraries."""

from __future__ import annotations

import os
import platform
import resource
from importlib import metadata

import psutil

LIBRARIES = ("trio", "trio-websocket", "trio-asyncio", "anyio", "msgspec", "kubernetes-asyncio", "aiohttp")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> dict[str, str]:
    """A flat description of this machine, for the report's header."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    load = os.getloadavg()
    versions = []
    for lib in LIBRARIES:
        try:
            versions.append(f"{lib} {metadata.version(lib)}")
        except metadata.PackageNotFoundError:
            continue
    return {
        "cpu": _cpu_model(),
        "cores": f"{psutil.cpu_count(logical=True)} logical ({psutil.cpu_count(logical=False)} physical)",
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "libraries": ", ".join(versions),
        "nofile": f"soft {soft}, hard {hard} (raised to the hard limit in the hub and fleet processes)",
        "load_at_start": " ".join(f"{x:.2f}" for x in load),
    }
