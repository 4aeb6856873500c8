"""Helpers that create test objects with kubectl, as a user would."""

from __future__ import annotations

import functools
import random
import subprocess
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import msgspec

from nodetask.phases import JobPhase
from roles.kube import Kube, Resource
from tests.integration.controlplane import ControlPlane


def unique(prefix: str) -> str:
    """A fresh object name: tests share one control plane per session."""
    return f"{prefix}-{random.randrange(16**8):08x}"


async def kubectl(cp: ControlPlane, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run kubectl as admin in a worker thread, so that the loop (and the roles running on it) goes on."""
    return await anyio.to_thread.run_sync(functools.partial(cp.kubectl, *args, input=input))


async def create_job(cp: ControlPlane, kind: str, name: str, spec: dict[str, object]) -> None:
    """Create a v1alpha2 node job."""
    doc = {"apiVersion": "operations.kubeedge.io/v1alpha2", "kind": kind, "metadata": {"name": name}, "spec": spec}
    await kubectl(cp, "create", "-f", "-", input=msgspec.json.encode(doc).decode())


async def job_when(
    kube: Kube, resource: Resource[Any], name: str, check: Callable[[Any], bool], *, limit_s: float = 60
) -> Any:
    """The job once ``check(job)`` holds, polled every 0.1 s; fails the test after ``limit_s`` seconds."""
    with anyio.fail_after(limit_s):
        while True:
            job = await kube.get(resource, name)
            if check(job):
                return job
            await anyio.sleep(0.1)


def settled(job: Any) -> bool:
    """The job reached Completed or Failure."""
    return job.status.phase in (JobPhase.COMPLETED, JobPhase.FAILURE)
