"""The ``node.resources`` and ``node.processes`` collectors, through psutil, in worker threads.

A module of its own so that psutil (and the sampling, which sleeps) is loaded by the first such
Task, not when the agent starts.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import anyio.to_thread
import msgspec
import psutil

from roles.edge.processors.outcome import MAX_VALUE_CHARS
from roles.edge.processors.request_keys import int_key, json_list

__all__ = ["ProcessSample", "node_processes", "node_resources", "top_processes"]

CPU_SAMPLE_S: Final = 0.5
"""Seconds over which CPU use (of the node and of each process) is measured."""
TOP_KEY: Final = "node.processes.top"
TOP_DEFAULT: Final = 5
TOP_MAX: Final = 50


class _Disk(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    mountpoint: str
    device: str = ""
    fstype: str = ""
    total_bytes: int = 0
    used_bytes: int = 0
    free_bytes: int = 0
    percent: float = 0.0
    error: str = ""


def _disks() -> list[_Disk]:
    disks: list[_Disk] = []
    seen: set[str] = set()
    for part in psutil.disk_partitions(all=False):
        if part.device in seen:  # bind mounts of one device count once
            continue
        seen.add(part.device)
        try:
            usage = psutil.disk_usage(part.mountpoint)
        except OSError as exc:
            disks.append(_Disk(mountpoint=part.mountpoint, device=part.device, error=str(exc)))
            continue
        disks.append(
            _Disk(
                mountpoint=part.mountpoint,
                device=part.device,
                fstype=part.fstype,
                total_bytes=usage.total,
                used_bytes=usage.used,
                free_bytes=usage.free,
                percent=usage.percent,
            )
        )
    return disks


def _resources_blocking() -> dict[str, str]:
    memory = psutil.virtual_memory()
    load = os.getloadavg()
    disks, shown = json_list(_disks(), MAX_VALUE_CHARS)
    return {
        "node.resources.cpu.count": str(psutil.cpu_count(logical=True) or 0),
        "node.resources.cpu.percent": str(psutil.cpu_percent(interval=CPU_SAMPLE_S)),
        "node.resources.load": " ".join(f"{x:.2f}" for x in load),
        "node.resources.memory.total": str(memory.total),
        "node.resources.memory.available": str(memory.available),
        "node.resources.memory.percent": str(memory.percent),
        "node.resources.uptime.seconds": str(int(time.time() - psutil.boot_time())),
        "node.resources.disks": disks,
        "node.resources.disks.count": str(shown),
    }


async def node_resources(_: Mapping[str, str]) -> dict[str, str]:
    """CPU, load, memory, uptime and mounted disks (see the builtin's documented keys)."""
    return await anyio.to_thread.run_sync(_resources_blocking, abandon_on_cancel=True)


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process as sampled."""

    pid: int
    name: str
    user: str
    cpu_percent: float
    rss_bytes: int


class _Process(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pid: int
    name: str
    user: str
    cpu_percent: float
    rss_bytes: int


def top_processes(samples: Iterable[ProcessSample], n: int) -> tuple[list[ProcessSample], list[ProcessSample]]:
    """The ``n`` processes using the most CPU and the ``n`` using the most memory, highest first (pid breaks ties)."""
    listed = list(samples)
    by_cpu = sorted(listed, key=lambda p: (-p.cpu_percent, p.pid))[:n]
    by_memory = sorted(listed, key=lambda p: (-p.rss_bytes, p.pid))[:n]
    return by_cpu, by_memory


def _sample_blocking() -> list[ProcessSample]:
    processes = list(psutil.process_iter(["pid", "name", "username", "memory_info"]))
    for process in processes:  # the first reading only starts each process's CPU clock
        with contextlib.suppress(psutil.Error):
            process.cpu_percent(None)
    time.sleep(CPU_SAMPLE_S)
    samples: list[ProcessSample] = []
    for process in processes:
        try:
            cpu = process.cpu_percent(None)
        except psutil.Error:  # gone since, or not ours to read
            continue
        info = process.info
        memory = info.get("memory_info")
        samples.append(
            ProcessSample(
                pid=process.pid,
                name=str(info.get("name") or ""),
                user=str(info.get("username") or ""),
                cpu_percent=round(cpu, 1),
                rss_bytes=int(memory.rss) if memory is not None else 0,
            )
        )
    return samples


def _listed(processes: list[ProcessSample]) -> str:
    items = [
        _Process(pid=p.pid, name=p.name, user=p.user, cpu_percent=p.cpu_percent, rss_bytes=p.rss_bytes)
        for p in processes
    ]
    return json_list(items, MAX_VALUE_CHARS // 2)[0]


async def node_processes(request: Mapping[str, str]) -> dict[str, str]:
    """The top processes by CPU and by memory; ``node.processes.top`` of the request says how many."""
    n = int_key(request, TOP_KEY, default=TOP_DEFAULT, low=1, high=TOP_MAX)
    samples = await anyio.to_thread.run_sync(_sample_blocking, abandon_on_cancel=True)
    by_cpu, by_memory = top_processes(samples, n)
    return {
        "node.processes.count": str(len(samples)),
        "node.processes.top.cpu": _listed(by_cpu),
        "node.processes.top.memory": _listed(by_memory),
    }
