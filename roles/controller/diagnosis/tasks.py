"""Creating a Diagnosis's Tasks, and releasing them (finalizer off, deleted) once the Diagnosis is gone.

Both go at the pace the client allows: it caps the requests in flight, and a stage over a thousand
nodes has a thousand Tasks.
"""

from __future__ import annotations

from collections.abc import Iterable

import anyio
import structlog

from flows.diagnosis.tasks import TASK_FINALIZER, owner_of
from roles.controller.diagnosis.caches import DiagnosisCaches, Key
from roles.kube import ApiError, Conflict, Kube, NotFound
from roles.kube.resources import TASKS
from schemas.diagnosis.v1 import Task

__all__ = ["create_tasks", "release_tasks"]

Log = structlog.typing.FilteringBoundLogger


async def create_tasks(kube: Kube, tasks: Iterable[Task], *, asked: set[str]) -> None:
    """Create the Tasks whose names are not in ``asked``, adding each created; one that exists is as good as created.

    Errors: the first :class:`~roles.kube.ApiError` of a refused create, once all were tried.
    """
    todo = [t for t in tasks if t.metadata.name not in asked]
    errors: list[ApiError] = []

    async def create(task: Task) -> None:
        try:
            await kube.create(TASKS, task, namespace=task.metadata.namespace)
        except Conflict:
            pass  # it exists: a name is a stage on a node, so it is this very Task
        except ApiError as exc:
            errors.append(exc)
            return
        asked.add(task.metadata.name)

    async with anyio.create_task_group() as tg:
        for task in todo:
            tg.start_soon(create, task)
    if errors:
        raise errors[0]


async def release_tasks(kube: Kube, caches: DiagnosisCaches, key: Key, *, keep: str | None, log: Log) -> None:
    """Take the finalizer off, and delete, every Task of ``key`` not owned by the live Diagnosis ``keep``.

    Errors: the first :class:`~roles.kube.ApiError` of a refused write, once all were tried.
    """
    todo: list[tuple[Key, Task]] = []
    for task_key in caches.owned.get(key, ()):
        task = caches.tasks[task_key]
        ref = owner_of(task)
        if task_key not in caches.released and ref is not None and ref.uid != keep:
            todo.append((task_key, task))
    errors: list[ApiError] = []

    async def release(task_key: Key, task: Task) -> None:
        meta = task.metadata
        try:
            if TASK_FINALIZER in meta.finalizers:
                rest = [f for f in meta.finalizers if f != TASK_FINALIZER]
                patch = {"metadata": {"finalizers": rest, "resourceVersion": meta.resource_version}}
                await kube.merge_patch(TASKS, meta.name, patch, namespace=meta.namespace)
            if meta.deletion_timestamp is None:
                await kube.delete(TASKS, meta.name, namespace=meta.namespace)
        except NotFound:
            pass
        except ApiError as exc:
            errors.append(exc)
            return
        caches.released.add(task_key)
        log.info("task_released", diagnosis=f"{key[0]}/{key[1]}", task=meta.name)

    async with anyio.create_task_group() as tg:
        for task_key, task in todo:
            tg.start_soon(release, task_key, task)
    if errors:
        raise errors[0]
