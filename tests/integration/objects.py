"""Helpers that create test objects with kubectl, as a user would."""

from __future__ import annotations

import functools
import random
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import msgspec

from flows.diagnosis.tasks import DIAGNOSIS_UID_LABEL
from nodetask.phases import ConditionStatus, JobPhase
from roles.kube import Kube, Resource
from roles.kube.resources import DIAGNOSES, TASKS
from schemas.diagnosis.v1 import Condition, Diagnosis, DiagnosisPhase, Task, TaskPhase
from tests.integration.controlplane import ControlPlane

T = TypeVar("T")


def unique(prefix: str) -> str:
    """A fresh object name: tests share one control plane per session."""
    return f"{prefix}-{random.randrange(16**8):08x}"


async def kubectl(cp: ControlPlane, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run kubectl as admin in a worker thread, so that the loop (and the roles running on it) goes on."""
    return await anyio.to_thread.run_sync(functools.partial(cp.kubectl, *args, input=input))


async def create_job(cp: ControlPlane, kind: str, name: str, spec: dict[str, object]) -> None:
    """Create a v1alpha2 node job."""
    doc = {"apiVersion": "operations.kubeedge.io/v1alpha2", "kind": kind, "metadata": {"name": name}, "spec": spec}
    # The API server's schema and the webhook judge the job; kubectl's own validation would parse the API
    # server's whole OpenAPI document first, a third of a second of CPU at each of the suite's hundred jobs.
    await kubectl(cp, "create", "--validate=false", "-f", "-", input=msgspec.json.encode(doc).decode())


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


async def diagnosis_when(
    kube: Kube, name: str, check: Callable[[Diagnosis], bool], *, namespace: str = "default", limit_s: float = 60
) -> Diagnosis:
    """The Diagnosis once ``check`` holds, polled every 0.1 s; fails the test after ``limit_s`` seconds."""
    with anyio.fail_after(limit_s):
        while True:
            diagnosis = await kube.get(DIAGNOSES, name, namespace=namespace)
            if check(diagnosis):
                return diagnosis
            await anyio.sleep(0.1)


def finished(diagnosis: Diagnosis) -> bool:
    """The Diagnosis reached Succeeded or Failed."""
    return diagnosis.status.phase in (DiagnosisPhase.SUCCEEDED, DiagnosisPhase.FAILED)


async def tasks_of(kube: Kube, diagnosis: Diagnosis) -> list[Task]:
    """The Diagnosis's Tasks, by the uid label the controller puts on each."""
    tasks, _, _ = await kube.list(
        TASKS, label_selector=f"{DIAGNOSIS_UID_LABEL}={diagnosis.metadata.uid}", namespace=diagnosis.metadata.namespace
    )
    return sorted(tasks, key=lambda t: t.metadata.name)


async def answer_task(kube: Kube, task: Task, *, ok: bool, results: dict[str, str] | None = None) -> Task:
    """Write what a hub writes for a Task: Running with Accepted, then Succeeded with results (or Failed)."""

    def accepted(t: Task) -> Task:
        condition = Condition(type="Accepted", status=ConditionStatus.TRUE, reason="TaskAccepted")
        status = msgspec.structs.replace(
            t.status, phase=TaskPhase.RUNNING, conditions=(condition,), start_time=t.metadata.creation_timestamp
        )
        return msgspec.structs.replace(t, status=status)

    def ended(t: Task) -> Task:
        condition = Condition(
            type="Complete" if ok else "Failed", status=ConditionStatus.TRUE, reason="Test", message="by the test"
        )
        status = msgspec.structs.replace(
            t.status,
            phase=TaskPhase.SUCCEEDED if ok else TaskPhase.FAILED,
            conditions=(*t.status.conditions, condition),
            results=results or {},
        )
        return msgspec.structs.replace(t, status=status)

    namespace = task.metadata.namespace
    await kube.update_status(TASKS, task.metadata.name, accepted, namespace=namespace)
    written = await kube.update_status(TASKS, task.metadata.name, ended, namespace=namespace)
    assert written is not None
    return written


async def polled(fetch: Callable[[], Awaitable[T]], check: Callable[[T], bool], *, limit_s: float = 30) -> T:
    """What ``fetch`` returns once ``check`` holds for it, asked every 0.1 s; fails the test after ``limit_s``."""
    with anyio.fail_after(limit_s):
        while True:
            found = await fetch()
            if check(found):
                return found
            await anyio.sleep(0.1)
