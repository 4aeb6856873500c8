"""The demo's container runtime: a real containerd and registry on loopback, seeded with the jobs' images.

All edges of the demo share this one containerd (they run on one machine); each still pulls through
its own CRI connection. Where containerd cannot run, :func:`start_runtime` says why and the demo
continues without a runtime, saying so.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tools.provision import containerd as _ctd


@dataclass
class Runtime:
    """A running containerd and registry, and the image references pushed to it."""

    containerd: _ctd.Containerd
    registry: _ctd.Registry
    images: list[str]

    @property
    def pids(self) -> list[int]:
        return [self.containerd.process.pid, self.registry.process.pid]

    def stop(self) -> list[str]:
        """Stop the registry and containerd; returns the errors, if any."""
        errors = []
        for service in (self.registry, self.containerd):
            try:
                service.stop()
            except _ctd.RuntimeServicesError as exc:
                errors.append(str(exc))
        return errors

    def pulled(self) -> list[str] | None:
        """Images containerd's CRI plugin holds (``ctr -n k8s.io images ls``); None when ctr is missing."""
        ctr = shutil.which("ctr")
        if ctr is None:
            return None
        address = str(self.containerd.socket)
        result = subprocess.run(
            [ctr, "--address", address, "--namespace", "k8s.io", "images", "ls", "-q"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        if result.returncode != 0:
            return None
        return sorted(line for line in result.stdout.split() if not line.startswith("sha256:"))


def start_runtime(directory: Path, repositories: Iterable[str]) -> Runtime:
    """Start containerd and an open registry under ``directory`` and push each ``name:tag`` to it.

    Errors:
        :class:`tools.provision.containerd.RuntimeServicesError` saying what could not be started or pushed;
        whatever was started is stopped again first.
    """
    tools = _ctd.ensure_tools()
    containerd = _ctd.start_containerd(directory / "containerd", tools)
    try:
        registry = _ctd.start_registry(directory / "registry", tools)
    except BaseException:
        containerd.stop()
        raise
    runtime = Runtime(containerd=containerd, registry=registry, images=[])
    try:
        containerd.allow_plain_http(registry.host)
        for repository in repositories:
            name, _, tag = repository.rpartition(":")
            runtime.images.append(registry.push(name, tag))
    except BaseException:
        runtime.stop()
        raise
    return runtime
