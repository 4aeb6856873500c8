"""A Diagnosis run in memory: the pure core driven to its end, with the test playing hub and edges."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import msgspec

from flows.diagnosis.pipeline import pipeline_of
from flows.diagnosis.run import advance, progress_only, start
from flows.diagnosis.step import FINAL_PHASES, Step, World
from flows.diagnosis.targets import Resolution
from flows.diagnosis.tasks import timed_out
from nodetask.clock import format_time
from schemas.diagnosis.v1 import (
    AdjacencyNode,
    Diagnosis,
    DiagnosisSpec,
    Operation,
    OperationSet,
    OperationSetSpec,
    OperationSpec,
    StagePolicy,
    TargetSelector,
    Task,
    TaskPhase,
)
from schemas.meta import ObjectMeta
from schemas.processors import Builtin, Processor

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TIMEOUT = 10
UID = "0123abcd-0000-0000-0000-000000000000"


class Outcome(enum.Enum):
    OK = "ok"
    FAIL = "fail"
    SILENT = "silent"


def operation_set(successors: list[list[int]], name: str = "g") -> OperationSet:
    nodes = tuple(AdjacencyNode(to=tuple(to), operation=f"op-{i}" if i else "") for i, to in enumerate(successors))
    return OperationSet(
        metadata=ObjectMeta(name=name, resource_version="1"), spec=OperationSetSpec(adjacency_list=nodes)
    )


def operations(count: int, timeout: int = TIMEOUT) -> dict[str, Operation]:
    processor = Processor(builtin=Builtin(name="node.resources"), timeout_seconds=timeout)
    return {
        f"op-{i}": Operation(metadata=ObjectMeta(name=f"op-{i}"), spec=OperationSpec(processor=processor))
        for i in range(1, count)
    }


def diagnosis(
    nodes: tuple[str, ...], *, policy: StagePolicy = StagePolicy.ALL, parameters: Mapping[str, str] | None = None
) -> Diagnosis:
    return Diagnosis(
        metadata=ObjectMeta(name="d", namespace="ns", uid=UID, creation_timestamp=format_time(T0)),
        spec=DiagnosisSpec(
            operation_set="g",
            parameters=dict(parameters or {}),
            target_selector=TargetSelector(node_names=nodes),
            stage_policy=policy,
        ),
    )


@dataclasses.dataclass
class Run:
    """The state a controller and the API server would hold, and what happened on the way."""

    successors: list[list[int]]
    outcome: Callable[[int, str], Outcome]
    """What the Task of graph node ``g`` does on target node ``n``."""
    diagnosis: Diagnosis
    opset: OperationSet
    ops: dict[str, Operation]
    now: datetime = T0
    results: Callable[[int, str], dict[str, str]] | None = None
    """The results of a Task that succeeds (default ``{"v": "<g>@<n>"}``)."""
    context_limit: int | None = None
    object_limit: int | None = None
    hold_progress: bool = False
    """Never write a status that only counts more ended Tasks of a stage (the controller's longest hold)."""
    writes: int = 0
    """Status writes made (the start's included)."""
    tasks: dict[str, Task] = dataclasses.field(default_factory=dict)
    created: list[Task] = dataclasses.field(default_factory=list)
    steps: list[Step] = dataclasses.field(default_factory=list)

    def world(self) -> World:
        world = World(pipeline=pipeline_of(self.opset), operations=self.ops, tasks=dict(self.tasks), now=self.now)
        if self.context_limit is not None:
            world = dataclasses.replace(world, context_limit=self.context_limit)
        if self.object_limit is not None:
            world = dataclasses.replace(world, object_limit=self.object_limit)
        return world

    def begin(self) -> Step:
        nodes = self.diagnosis.spec.target_selector.targets().node_names  # type: ignore[union-attr]
        step = start(self.diagnosis, self.world(), Resolution(nodes))
        meta = msgspec.structs.replace(self.diagnosis.metadata, labels={**step.labels})
        self.diagnosis = msgspec.structs.replace(self.diagnosis, metadata=meta, status=step.status)
        self.steps.append(step)
        self.writes += 1
        return step

    def hub(self, task: Task) -> Task:
        """What the hub and the edge make of a new Task: a result at once, or silence."""
        graph_node = int(task.spec.operation.removeprefix("op-"))
        task = msgspec.structs.replace(
            task, metadata=msgspec.structs.replace(task.metadata, creation_timestamp=format_time(self.now))
        )
        match self.outcome(graph_node, task.spec.node_name):
            case Outcome.OK:
                node = task.spec.node_name
                results = self.results(graph_node, node) if self.results else {"v": f"{graph_node}@{node}"}
                status = msgspec.structs.replace(task.status, phase=TaskPhase.SUCCEEDED, results=results)
            case Outcome.FAIL:
                status = msgspec.structs.replace(task.status, phase=TaskPhase.FAILED)
            case Outcome.SILENT:
                status = task.status
        return msgspec.structs.replace(task, status=status)

    def turn(self, *, write: bool = True, create: bool = True) -> Step:
        """One controller pass; ``write=False`` loses its status write, ``create=False`` its creations
        (a crash before, or right after, the write)."""
        step = advance(self.diagnosis, self.world())
        if step.expire:
            for name in step.expire:
                expired = timed_out(self.tasks[name], timeout_seconds=TIMEOUT, now=self.now)
                assert expired is not None, name
                self.tasks[name] = expired
            step = advance(self.diagnosis, self.world())
        self.steps.append(step)
        if not write:
            return step
        held = self.hold_progress and progress_only(self.diagnosis.status, step)
        if step.status != self.diagnosis.status and not held:
            self.diagnosis = msgspec.structs.replace(self.diagnosis, status=step.status)
            self.writes += 1
        if create:
            for task in step.create:
                assert task.metadata.name not in self.tasks, f"{task.metadata.name} created twice"
                self.created.append(task)
                self.tasks[task.metadata.name] = self.hub(task)
        return step

    def to_end(self, crashes: list[tuple[bool, bool]] | None = None, limit: int = 10_000) -> None:
        """Turn until the Diagnosis ends, moving time to the next deadline when nothing else happens."""
        crashes = list(crashes or ())
        for _ in range(limit):
            if self.diagnosis.status.phase in FINAL_PHASES:
                return
            before = (self.diagnosis.status, len(self.tasks))
            write, create = crashes.pop(0) if crashes else (True, True)
            step = self.turn(write=write, create=create)
            if (self.diagnosis.status, len(self.tasks)) == before and not step.expire and write and create:
                assert step.due is not None, "a running Diagnosis with nothing to wait for"
                assert step.due > self.now
                self.now = step.due
        raise AssertionError("the run did not end")
