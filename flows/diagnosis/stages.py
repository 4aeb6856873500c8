"""A running Diagnosis's stages walked: count each ended Task once, pass or fail the stage, create the next Tasks.

The run walks the compiled flow one stage at a time. A stage is one Task per target node
(:mod:`flows.diagnosis.tasks`); once every one of them has ended, the stage passes when all
succeeded (``stagePolicy: All``, the design's rule) or at least one did (``Any``, KubeDiag's code).
A passing stage leads to the next stage of its path, the last one to Succeeded; a failing stage
adds every path through it to ``failedPaths`` and leads to the next path's first stage it does not
share with them, so a stage passed on a shared prefix is not run again; no path left is Failed.
A Task that stays silent past its operation's timeout is declared Unknown (a failure), so no stage
waits forever; a stage whose Operation does not exist fails at once, without Tasks.

The checkpoint is KubeDiag's: ``pathIndex`` and ``nodeIndex`` name the stage (the first path
through it and its depth), ``desired`` is the number of target nodes, ``succeeded`` and ``failed``
count the stage's ended Tasks, each once (its node's bit goes into ``synchronizedNodes`` in the same
write, :mod:`flows.diagnosis.counted`), and ``active`` is the rest. Since the checkpoint and the
counts are written together, conditionally on the object's version, a controller that restarts or
takes over mid-run resumes exactly there: Task names are deterministic, so it finds the stage's
Tasks instead of creating them again, and never counts one twice. Each succeeded Task's results go to
``context.operations.<operation>.<task>`` while they fit (:mod:`flows.diagnosis.context`), and from
the Task itself on to the next stages' Tasks on the same node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import Final

import msgspec

from flows.diagnosis.context import ContextBudget
from flows.diagnosis.counted import CountedNodes, InvalidCountError, counted_nodes
from flows.diagnosis.paths import Stage
from flows.diagnosis.pipeline import Pipeline
from flows.diagnosis.size import context_room
from flows.diagnosis.step import Notice, Step, World, finish
from flows.diagnosis.tasks import deadline, is_final, new_task, task_name
from nodetask.flow import UnknownActionError
from schemas.diagnosis.v1 import (
    Checkpoint,
    Diagnosis,
    DiagnosisConditionType,
    DiagnosisContext,
    DiagnosisPhase,
    DiagnosisStatus,
    Operation,
    Path,
    PodReference,
    StagePolicy,
    Task,
    TaskPhase,
)

__all__ = ["PODS_ANNOTATION", "StageWalk"]

PODS_ANNOTATION: Final = "diagnosis.kubediag.org/target-pods"
"""On a Diagnosis targeting pods: JSON ``{node: {namespace, name, container}}``, the pod each node's
Tasks carry, resolved with the nodes when the run started."""

ALL_PATHS_FAILED: Final = "AllPathsFailed"
INVALID_CHECKPOINT: Final = "InvalidCheckpoint"


class StageWalk:
    """One decision over a running Diagnosis: synchronize the stage, move on while stages are decided."""

    def __init__(self, diagnosis: Diagnosis, world: World, pipeline: Pipeline) -> None:
        self.diagnosis = diagnosis
        self.world = world
        self.pipeline = pipeline
        self.plan = pipeline.plan
        status = diagnosis.status
        self.nodes = status.node_names
        self.checkpoint = status.checkpoint or Checkpoint(desired=len(self.nodes), active=len(self.nodes))
        context = status.context or DiagnosisContext(parameters=dict(diagnosis.spec.parameters))
        room = context_room(diagnosis, paths_bytes=pipeline.paths_bytes, limit=world.object_limit)
        self.budget = ContextBudget(context, status.conditions, limit=max(0, min(world.context_limit, room)))
        self.failed_paths: tuple[Path, ...] = status.failed_paths
        self.succeeded_path: Path = status.succeeded_path
        self.notices: list[Notice] = []

    def walk(self) -> Step:
        # Each round decides one stage or stops; a flow has no cycle, so its size bounds the rounds.
        for _ in range(len(self.plan.stages) + 1):
            cp = self.checkpoint
            try:
                action = self.plan.action_at(cp.path_index, cp.node_index)
            except UnknownActionError as exc:
                return self._finish(DiagnosisPhase.FAILED, INVALID_CHECKPOINT, str(exc))
            stage = self.plan.stage(action)
            operation = self.world.operations.get(stage.operation)
            if operation is None:
                ok = False
                message = f"{_stage_name(stage, cp)}: Operation {stage.operation} is not found"
                self.notices.append(Notice("Warning", DiagnosisConditionType.OPERATION_NOT_FOUND.value, message))
            else:
                try:
                    counted = self._synchronize(stage)
                except InvalidCountError as exc:
                    return self._finish(DiagnosisPhase.FAILED, INVALID_CHECKPOINT, str(exc))
                if self.checkpoint.active > 0:
                    return self._wait(stage, operation, counted)
                ok = self._passes()
                self._tell_verdict(stage, ok)
            following = self.plan.flow.next(action, ok)
            if not ok:
                self.failed_paths += self.pipeline.paths[cp.path_index : stage.last_path + 1]
            if following is None:
                if ok:
                    self.succeeded_path = self.pipeline.paths[cp.path_index]
                    return self._finish(
                        DiagnosisPhase.SUCCEEDED, "DiagnosisComplete", f"path {cp.path_index} passed every stage"
                    )
                self.succeeded_path = ()
                return self._finish(DiagnosisPhase.FAILED, ALL_PATHS_FAILED, "every path failed at one of its stages")
            after = self.plan.stage(following)
            self.checkpoint = Checkpoint(
                path_index=after.first_path, node_index=after.depth, desired=len(self.nodes), active=len(self.nodes)
            )
            self.succeeded_path = self.pipeline.paths[after.first_path][: after.depth]
        raise AssertionError("a run visits each stage at most once")

    def _synchronize(self, stage: Stage) -> CountedNodes:
        """Count the stage's Tasks that ended since the last write, each once, and keep their results.

        Returns the nodes whose Task is now counted. Errors: :class:`InvalidCountError` for a
        checkpoint whose record of them cannot be read.
        """
        cp = self.checkpoint
        names = [task_name(self.diagnosis, node, stage) for node in self.nodes]
        counted = counted_nodes(cp, names)
        succeeded, failed = cp.succeeded, cp.failed
        for i, name in enumerate(names):
            task = self.world.tasks.get(name)
            if i in counted or task is None or not is_final(task.status.phase):
                continue
            counted.add(i)
            if task.status.phase is TaskPhase.SUCCEEDED:
                succeeded += 1
                self.budget.add(stage.operation, name, task.status.results, self.world.now)
            else:
                failed += 1
        desired = len(self.nodes)
        self.checkpoint = Checkpoint(
            path_index=cp.path_index,
            node_index=cp.node_index,
            desired=desired,
            active=max(0, desired - succeeded - failed),
            succeeded=succeeded,
            failed=failed,
            synchronized_nodes=counted.encode(),
        )
        return counted

    def _passes(self) -> bool:
        cp = self.checkpoint
        if self.diagnosis.spec.stage_policy is StagePolicy.ANY:
            return cp.succeeded > 0
        return cp.failed == 0

    def _tell_verdict(self, stage: Stage, ok: bool) -> None:
        cp = self.checkpoint
        name = _stage_name(stage, cp)
        if ok:
            message = f"{name} passed: {cp.succeeded} of {cp.desired} Tasks succeeded"
            self.notices.append(Notice("Normal", "StagePassed", message))
            return
        paths = range(cp.path_index, stage.last_path + 1)
        failed = f"path {paths[0]}" if len(paths) == 1 else f"paths {paths[0]} to {paths[-1]}"
        message = f"{name} failed: {cp.failed} of {cp.desired} Tasks failed; {failed} failed"
        self.notices.append(Notice("Warning", "OperationFailed", message))

    def _status(self) -> DiagnosisStatus:
        return msgspec.structs.replace(
            self.diagnosis.status,
            conditions=self.budget.conditions,
            checkpoint=self.checkpoint,
            context=self.budget.context,
            failed_paths=self.failed_paths,
            succeeded_path=self.succeeded_path,
        )

    def _wait(self, stage: Stage, operation: Operation, counted: CountedNodes) -> Step:
        """The stage runs: create its missing Tasks, expire silent ones, look again at the next deadline."""
        status = self._status()
        diagnosis = msgspec.structs.replace(self.diagnosis, status=status)
        timeout = operation.spec.processor.timeout_seconds
        now = self.world.now
        pods = _pods(self.diagnosis)
        results = _Results(self.world.tasks)
        create: list[Task] = []
        expire: list[str] = []
        dues: list[datetime] = []
        cp = self.checkpoint
        for i, node in enumerate(self.nodes):
            name = task_name(diagnosis, node, stage)
            task = self.world.tasks.get(name)
            if task is None:
                if i not in counted:  # a counted Task deleted by hand is not run again
                    create.append(
                        new_task(
                            diagnosis,
                            self.plan,
                            path_index=cp.path_index,
                            node_index=cp.node_index,
                            node=node,
                            pod=pods.get(node),
                            results=results,
                        )
                    )
                    dues.append(now + timedelta(seconds=timeout))
                continue
            due = deadline(task, timeout)
            if due is None:
                continue
            if now >= due:
                expire.append(name)
            else:
                dues.append(due)
        return Step(
            status=status,
            create=tuple(create),
            expire=tuple(expire),
            notices=tuple(self.notices),
            due=min(dues, default=None),
        )

    def _finish(self, phase: DiagnosisPhase, reason: str, message: str) -> Step:
        step = finish(self.diagnosis, self._status(), phase, reason, message, now=self.world.now)
        return dataclasses.replace(step, notices=(*self.notices, *step.notices))


class _Results(Mapping[str, Mapping[str, str]]):
    """The results of the succeeded Tasks among ``tasks``, by Task name: what later stages are given."""

    def __init__(self, tasks: Mapping[str, Task]) -> None:
        self._tasks = tasks

    def __getitem__(self, name: str) -> Mapping[str, str]:
        task = self._tasks[name]
        if task.status.phase is not TaskPhase.SUCCEEDED:
            raise KeyError(name)
        return task.status.results

    def __iter__(self) -> Iterator[str]:
        return (name for name, task in self._tasks.items() if task.status.phase is TaskPhase.SUCCEEDED)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _stage_name(stage: Stage, cp: Checkpoint) -> str:
    return f"stage {stage.depth} of path {cp.path_index} ({stage.operation})"


def _pods(diagnosis: Diagnosis) -> dict[str, PodReference]:
    text = diagnosis.metadata.annotations.get(PODS_ANNOTATION)
    if not text:
        return {}
    try:
        return msgspec.json.decode(text, type=dict[str, PodReference])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}  # edited by hand into something else: the Tasks just carry no pod
