"""What the diagnosis controller's watches have shown of the five kinds, and which workers each change concerns.

Of a Node only its name and labels are kept (whether it exists, and is an edge node:
:mod:`flows.diagnosis.targets`). Tasks are kept under their Diagnosis's (namespace, name), so a
Diagnosis's worker finds its Tasks without a scan. Each handler updates the caches and answers the
:class:`Pokes` its event calls for; the controller pokes those workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from flows.diagnosis.pipeline import BrokenGraph, Pipeline, pipeline_of
from flows.diagnosis.step import World
from flows.diagnosis.tasks import owner_of
from roles.kube import Deleted, Invalid, Relisted, Upserted, WatchEvent
from roles.kube.following import mirror_by_name
from roles.kube.versions import revision
from schemas.core import Node
from schemas.diagnosis.v1 import Diagnosis, DiagnosisPhase, Operation, OperationSet, Task
from schemas.meta import ObjectMeta

__all__ = ["DiagnosisCaches", "Key", "Pokes", "slim"]

Key = tuple[str, str]
"""(namespace, name) of a Diagnosis or Task."""


def slim(node: Node) -> Node:
    """What the cache keeps of a Node: its name and labels (whether it is an edge node)."""
    return Node(metadata=ObjectMeta(name=node.metadata.name, labels=node.metadata.labels))


def _version(obj: Any) -> int:
    return revision(obj.metadata.resource_version)


@dataclass(frozen=True, slots=True)
class Pokes:
    """The workers a change concerns: Diagnoses by (namespace, name), OperationSets by name."""

    runs: tuple[Key, ...] = ()
    sets: tuple[str, ...] = ()


class DiagnosisCaches:
    """The five kinds as the watches show them, and the Tasks this controller asked for or let go."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        """Every Node, by name: its name and labels only (whether it exists, and is an edge node)."""
        self.operations: dict[str, Operation] = {}
        self.operation_sets: dict[str, OperationSet] = {}
        self.undecodable_sets: dict[str, str] = {}
        self._pipelines: dict[str, tuple[str, Pipeline | BrokenGraph]] = {}
        """Per OperationSet: the resourceVersion compiled and the result (a compile can take 17 ms)."""
        self.diagnoses: dict[Key, Diagnosis] = {}
        self.tasks: dict[Key, Task] = {}
        self.owned: dict[Key, set[Key]] = {}
        """Tasks by their Diagnosis's (namespace, name)."""
        self.created: dict[Key, set[str]] = {}
        """Per Diagnosis, Tasks created (or found to exist) that the watch has not shown yet: not asked for twice."""
        self.released: set[Key] = set()
        """Tasks whose finalizer was taken off and that were deleted, until the watch shows them gone."""

    def on_node(self, event: WatchEvent) -> Pokes:
        match event:
            case Relisted(objects=objects):
                self.nodes = {n.metadata.name: slim(n) for n in objects}
            case Upserted(obj=node):
                self.nodes[node.metadata.name] = slim(node)
            case Deleted(obj=node):
                self.nodes.pop(node.metadata.name, None)
        return Pokes()

    def on_operation(self, event: WatchEvent) -> Pokes:
        if mirror_by_name(self.operations, event):
            return Pokes(runs=self._running(lambda d: True))
        return Pokes()

    def on_operation_set(self, event: WatchEvent) -> Pokes:
        match event:
            case Relisted(objects=objects, invalid=invalid):
                self.operation_sets = {s.metadata.name: s for s in objects}
                self.undecodable_sets = {i.name: i.error for i in invalid}
                changed = None
            case Upserted(obj=operation_set):
                self.operation_sets[operation_set.metadata.name] = operation_set
                self.undecodable_sets.pop(operation_set.metadata.name, None)
                changed = operation_set.metadata.name
            case Deleted(obj=operation_set):
                self.operation_sets.pop(operation_set.metadata.name, None)
                changed = operation_set.metadata.name
            case Invalid(name=name, error=error):
                self.operation_sets.pop(name, None)
                self.undecodable_sets[name] = error
                changed = name
            case _:
                return Pokes()
        sets = tuple(n for n in (self.operation_sets if changed is None else (changed,)) if n in self.operation_sets)
        return Pokes(runs=self._running(lambda d: changed is None or d.spec.operation_set == changed), sets=sets)

    def on_task(self, event: WatchEvent) -> Pokes:
        match event:
            case Relisted(objects=objects):
                before = set(self.owned)
                self.tasks, self.owned = {}, {}
                self.released &= {(t.metadata.namespace, t.metadata.name) for t in objects}
                for task in objects:
                    self.store_task(task)
                return Pokes(runs=tuple(before | set(self.owned)))
            case Upserted(obj=task):
                stored = self.store_task(task)
                if stored is not None:
                    self.created.get(stored, set()).discard(task.metadata.name)
                    return Pokes(runs=(stored,))
            case Deleted(obj=task):
                key = (task.metadata.namespace, task.metadata.name)
                self.tasks.pop(key, None)
                self.released.discard(key)
                ref = owner_of(task)
                if ref is not None:
                    owner = (task.metadata.namespace, ref.name)
                    self.owned.get(owner, set()).discard(key)
                    return Pokes(runs=(owner,))
        return Pokes()

    def store_task(self, task: Task, *, only_newer: bool = False) -> Key | None:
        """Cache ``task`` under its Diagnosis; returns the Diagnosis's key (None for a Task nobody owns)."""
        ref = owner_of(task)
        if ref is None:
            return None
        key = (task.metadata.namespace, task.metadata.name)
        cached = self.tasks.get(key)
        if only_newer and cached is not None and _version(cached) > _version(task):
            return None
        self.tasks[key] = task
        owner = (task.metadata.namespace, ref.name)
        self.owned.setdefault(owner, set()).add(key)
        return owner

    def on_diagnosis(self, event: WatchEvent) -> Pokes:
        match event:
            case Relisted(objects=objects):
                gone = set(self.diagnoses)
                self.diagnoses = {(d.metadata.namespace, d.metadata.name): d for d in objects}
                return Pokes(runs=tuple(gone | set(self.diagnoses) | set(self.owned)))
            case Upserted(obj=diagnosis) | Deleted(obj=diagnosis):
                key = (diagnosis.metadata.namespace, diagnosis.metadata.name)
                if isinstance(event, Deleted):
                    self.diagnoses.pop(key, None)
                else:
                    self.diagnoses[key] = diagnosis
                return Pokes(runs=(key,))
        return Pokes()

    def _running(self, wanted: Callable[[Diagnosis], bool]) -> tuple[Key, ...]:
        return tuple(
            key
            for key, diagnosis in self.diagnoses.items()
            if diagnosis.status.phase not in (DiagnosisPhase.SUCCEEDED, DiagnosisPhase.FAILED) and wanted(diagnosis)
        )

    def world(self, diagnosis: Diagnosis, now: datetime) -> World:
        """What the pure rules see of ``diagnosis``'s run: its graph, the Operations and its own Tasks."""
        meta = diagnosis.metadata
        tasks: dict[str, Task] = {}
        for key in self.owned.get((meta.namespace, meta.name), ()):
            task = self.tasks[key]
            ref = owner_of(task)
            if ref is not None and ref.uid == meta.uid:
                tasks[key[1]] = task
        return World(
            pipeline=self.pipeline(diagnosis.spec.operation_set),
            operations=MappingProxyType(self.operations),
            tasks=MappingProxyType(tasks),
            now=now,
        )

    def pipeline(self, name: str) -> Pipeline | BrokenGraph | None:
        """The OperationSet ``name`` compiled (once per resourceVersion); None while there is none."""
        operation_set = self.operation_sets.get(name)
        if operation_set is None:
            error = self.undecodable_sets.get(name)
            return None if error is None else BrokenGraph("", (f"spec does not decode: {error}",))
        version = operation_set.metadata.resource_version
        cached = self._pipelines.get(name)
        if cached is not None and cached[0] == version:
            return cached[1]
        pipeline = pipeline_of(operation_set)
        self._pipelines[name] = (version, pipeline)
        return pipeline
