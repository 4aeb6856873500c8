"""One diagnosis Task as the hub holds it: its newest copy, its status writer while it has not ended, and
its worker while one sends it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import anyio
import msgspec

from roles.cloud.jobs.status_writer import StatusWriter
from roles.kube.versions import fresher
from schemas.diagnosis.v1 import Task, TaskPhase

__all__ = ["FINAL", "TaskState", "is_fresher", "kept"]

FINAL: Final = frozenset({TaskPhase.SUCCEEDED, TaskPhase.FAILED, TaskPhase.UNKNOWN})
"""The phases no write moves a Task out of."""


@dataclass(slots=True, eq=False)
class TaskState:
    """One Task: its newest copy, its status writer while it has not ended, and its worker while one runs."""

    task: Task
    writer: StatusWriter | None = None
    worker: anyio.CancelScope | None = None
    node: str = ""
    """The node it is indexed under among the open Tasks, if it is."""
    gone: bool = False
    changed: anyio.Event = field(default_factory=anyio.Event)

    @property
    def final(self) -> bool:
        return self.task.status.phase in FINAL

    @property
    def open(self) -> bool:
        """Still to run: not ended, not deleted or being deleted."""
        return not (self.gone or self.final or self.task.metadata.deletion_timestamp is not None)

    def update(self, task: Task) -> None:
        self.task = task
        self.changed.set()
        self.changed = anyio.Event()


def is_fresher(new: Task, old: Task) -> bool:
    """Whether ``new`` is a newer copy of the Task than ``old``."""
    return fresher(new.metadata.resource_version, old.metadata.resource_version)


def kept(task: Task) -> Task:
    """What the cache keeps of ``task``: an ended Task is never written again, so not its request or results."""
    if task.status.phase not in FINAL:
        return task
    spec = msgspec.structs.replace(task.spec, parameters={})
    return msgspec.structs.replace(task, spec=spec, status=msgspec.structs.replace(task.status, results={}))
