"""A Diagnosis run as a pure state machine: from what the controller sees to what it writes next.

:func:`start` takes a new Diagnosis and its resolved targets; :func:`advance` takes a running one,
its OperationSet's compiled paths (:mod:`flows.diagnosis.pipeline`), the Operations and the
Diagnosis's Tasks, and returns a :class:`Step`: the status to write, the Tasks to create, the
Tasks to declare Unknown, the Events to record and when to look again. Nothing here reads a clock
or the API; ``roles.controller.diagnoses`` does the I/O, and is the only writer of a Diagnosis's
status (KubeDiag's agents race each other on it).

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
counts are written together,
conditionally on the object's version, a controller that restarts or takes over mid-run resumes
exactly there: Task names are deterministic, so it finds the stage's Tasks instead of creating
them again, and never counts one twice. Each succeeded Task's results go to
``context.operations.<operation>.<task>`` while they fit (:mod:`flows.diagnosis.context`), and from
the Task itself on to the next stages' Tasks on the same node.

The run fails with ``OperationSetChanged`` when the OperationSet's graph no longer has the hash
stamped on the Diagnosis when it started, ``OperationSetNotFound`` or ``OperationSetNotReady``
when there is none or it cannot run, with ``NoTargets`` when its targets select no node, and
before any Task with ``TooManyTargets`` or ``ParametersTooLarge`` when it has more targets or
parameters than a Diagnosis may (what the webhook refuses; checked again here for one stored while
the webhook was away).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final

import msgspec

from flows.diagnosis.conditions import find_condition, set_condition
from flows.diagnosis.context import MAX_CONTEXT_BYTES, ContextBudget
from flows.diagnosis.counted import CountedNodes, InvalidCountError, counted_nodes
from flows.diagnosis.paths import Stage
from flows.diagnosis.pipeline import HASH_LABEL, BrokenGraph, Pipeline
from flows.diagnosis.size import (
    MAX_ANNOTATIONS_BYTES,
    MAX_OBJECT_BYTES,
    STATUS_TOO_LARGE,
    context_room,
    object_bytes,
    reserve,
    shrunk,
    too_large_message,
)
from flows.diagnosis.targets import Resolution, listed
from flows.diagnosis.tasks import deadline, is_final, new_task, task_name
from nodetask.clock import format_time, parse_time
from nodetask.flow import UnknownActionError
from nodetask.phases import ConditionStatus
from schemas.diagnosis.v1 import (
    MAX_PARAMETERS_BYTES,
    Checkpoint,
    Condition,
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
    parameters_bytes,
)

__all__ = [
    "FINAL_PHASES",
    "OPERATION_SET_GRACE",
    "PODS_ANNOTATION",
    "Notice",
    "Step",
    "World",
    "advance",
    "awaiting_operation_set",
    "fail_too_large",
    "parameters_problem",
    "progress_only",
    "start",
]

PODS_ANNOTATION: Final = "diagnosis.kubediag.org/target-pods"
OPERATION_SET_GRACE: Final = timedelta(seconds=30)
"""How long a new Diagnosis waits for an OperationSet that is not there, before failing with
OperationSetNotFound: ``kubectl apply`` of one file creates its objects one by one, in the file's
order, so a Diagnosis may be seen a moment before the OperationSet applied with it."""
"""On a Diagnosis targeting pods: JSON ``{node: {namespace, name, container}}``, the pod each node's
Tasks carry, resolved with the nodes when the run started."""

FINAL_PHASES: Final = frozenset((DiagnosisPhase.SUCCEEDED, DiagnosisPhase.FAILED, DiagnosisPhase.UNKNOWN))

ACCEPTED: Final = DiagnosisConditionType.ACCEPTED.value
COMPLETE: Final = DiagnosisConditionType.COMPLETE.value
NO_TARGETS: Final = "NoTargets"
TOO_MANY_TARGETS: Final = "TooManyTargets"
PARAMETERS_TOO_LARGE: Final = "ParametersTooLarge"
ALL_PATHS_FAILED: Final = "AllPathsFailed"
INVALID_CHECKPOINT: Final = "InvalidCheckpoint"
_KUBEDIAG_CONDITIONS: Final = frozenset(
    (
        DiagnosisConditionType.OPERATION_SET_CHANGED.value,
        DiagnosisConditionType.OPERATION_SET_NOT_READY.value,
        DiagnosisConditionType.OPERATION_SET_NOT_FOUND.value,
    )
)
"""Failures KubeDiag records as a condition of their own type as well."""


@dataclass(frozen=True, slots=True)
class World:
    """What one decision about a Diagnosis reads besides the Diagnosis itself."""

    pipeline: Pipeline | BrokenGraph | None
    """The Diagnosis's OperationSet compiled; None when it does not exist."""
    operations: Mapping[str, Operation]
    tasks: Mapping[str, Task]
    """The Diagnosis's Tasks by name (those it owns)."""
    now: datetime
    context_limit: int = MAX_CONTEXT_BYTES
    """Bytes of results ``status.context`` keeps (:mod:`flows.diagnosis.context`), if the rest leaves room."""
    object_limit: int = MAX_OBJECT_BYTES
    """Bytes the Diagnosis may take with its status (:mod:`flows.diagnosis.size`)."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A Kubernetes Event to record on the Diagnosis."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Step:
    """What to do next: write metadata (a start only), then the status, then create and expire Tasks."""

    status: DiagnosisStatus
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Labels to set on the Diagnosis before its status is written."""
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    create: tuple[Task, ...] = ()
    expire: tuple[str, ...] = ()
    """Tasks past their deadline without a result: to declare Unknown, then decide again."""
    notices: tuple[Notice, ...] = ()
    due: datetime | None = None
    """When to decide again without anything changing: the next Task deadline, or the TTL."""
    delete: bool = False
    """The Diagnosis has outlived ``ttlSecondsAfterFinished``: delete it (its Tasks go with it)."""


def awaiting_operation_set(diagnosis: Diagnosis, world: World) -> datetime | None:
    """Until when a new Diagnosis waits for its OperationSet, which is not there yet; None: decide now.

    Only an OperationSet that does not exist is waited for (one that does not decode or cannot run
    fails the Diagnosis at once), and only :data:`OPERATION_SET_GRACE` after the Diagnosis was created.
    """
    if world.pipeline is not None or not diagnosis.metadata.creation_timestamp:
        return None
    try:
        until = parse_time(diagnosis.metadata.creation_timestamp) + OPERATION_SET_GRACE
    except ValueError:
        return None
    return until if world.now < until else None


def parameters_problem(diagnosis: Diagnosis) -> str | None:
    """Why a Diagnosis's parameters keep it from running (more than the webhook admits), or None."""
    size = parameters_bytes(diagnosis.spec.parameters)
    if size <= MAX_PARAMETERS_BYTES:
        return None
    return f"spec.parameters take {size} bytes as JSON, more than the {MAX_PARAMETERS_BYTES} a Diagnosis's may"


def start(diagnosis: Diagnosis, world: World, targets: Resolution) -> Step:
    """The first step of a new Diagnosis: Running on the resolved targets, or Failed saying why."""
    problem = _pipeline_problem(diagnosis, world.pipeline)
    if problem is not None:
        return _finish(diagnosis, diagnosis.status, DiagnosisPhase.FAILED, *problem, now=world.now)
    too_large = parameters_problem(diagnosis)
    if too_large is not None:
        return _refuse(diagnosis, PARAMETERS_TOO_LARGE, too_large, now=world.now)
    if not targets.nodes:
        reason = TOO_MANY_TARGETS if targets.too_many else NO_TARGETS
        return _refuse(diagnosis, reason, targets.empty_reason, now=world.now)
    assert isinstance(world.pipeline, Pipeline)
    count = len(targets.nodes)
    message = f"{count} target node{'' if count == 1 else 's'}"
    if targets.skipped:
        message += f"; left out: {listed(targets.skipped)}"
    accepted = Condition(type=ACCEPTED, status=ConditionStatus.TRUE, reason="TargetsResolved", message=message)
    status = DiagnosisStatus(
        phase=DiagnosisPhase.RUNNING,
        conditions=set_condition(diagnosis.status.conditions, accepted, world.now),
        start_time=format_time(world.now),
        node_names=targets.nodes,
        checkpoint=Checkpoint(desired=count, active=count),
        context=DiagnosisContext(parameters=dict(diagnosis.spec.parameters)),
    )
    pods = {PODS_ANNOTATION: msgspec.json.encode(dict(targets.pods)).decode()} if targets.pods else {}
    notices = [Notice("Normal", "DiagnosisRunning", f"OperationSet {diagnosis.spec.operation_set} on {message}")]
    step = Step(
        status=status,
        labels=MappingProxyType({HASH_LABEL: world.pipeline.hash}),
        annotations=MappingProxyType(pods),
        notices=tuple(notices),
    )
    started = _stamped(diagnosis, step)
    too_large = _start_too_large(started, world.pipeline, world.object_limit)
    if too_large is not None:
        return _refuse(diagnosis, STATUS_TOO_LARGE, too_large, now=world.now)
    return step


def _refuse(diagnosis: Diagnosis, reason: str, message: str, *, now: datetime) -> Step:
    """A new Diagnosis that cannot run: Accepted False and Failed, both with ``reason`` and ``message``."""
    refused = Condition(type=ACCEPTED, status=ConditionStatus.FALSE, reason=reason, message=message)
    base = msgspec.structs.replace(
        diagnosis.status,
        start_time=format_time(now),
        conditions=set_condition(diagnosis.status.conditions, refused, now),
    )
    return _finish(diagnosis, base, DiagnosisPhase.FAILED, reason, message, now=now)


def _stamped(diagnosis: Diagnosis, step: Step) -> Diagnosis:
    """``diagnosis`` as ``step`` leaves it: its labels and annotations set, its status written."""
    meta = diagnosis.metadata
    if step.labels or step.annotations:
        meta = msgspec.structs.replace(
            meta, labels={**meta.labels, **step.labels}, annotations={**meta.annotations, **step.annotations}
        )
    return msgspec.structs.replace(diagnosis, metadata=meta, status=step.status)


def _start_too_large(started: Diagnosis, pipeline: Pipeline, limit: int) -> str | None:
    """Why a run cannot start on these targets for its size, or None: its status must fit with every path
    failed and every node counted, and the pods it records must fit in the annotations Kubernetes allows."""
    annotations = sum(len(k) + len(v) for k, v in started.metadata.annotations.items())
    if annotations > MAX_ANNOTATIONS_BYTES:
        pods = started.metadata.annotations.get(PODS_ANNOTATION, "")
        return (
            f"the pods of its {len(started.status.node_names)} target nodes take {len(pods)} bytes in the"
            f" annotation {PODS_ANNOTATION}, and a Diagnosis's annotations may take at most"
            f" {MAX_ANNOTATIONS_BYTES} bytes in all"
        )
    if context_room(started, paths_bytes=pipeline.paths_bytes, limit=limit) >= 0:
        return None
    size = object_bytes(started) + reserve(pipeline.paths_bytes, len(started.status.node_names))
    return too_large_message(started, size=size, limit=limit)


def advance(diagnosis: Diagnosis, world: World) -> Step:
    """The next step of a started Diagnosis (see the module docstring); its own status if nothing changes.

    Deciding again on the status a step wrote gives that status back: a step is idempotent, which
    is what lets a write be retried on a fresh copy, and a new leader resume.
    """
    status = diagnosis.status
    if status.phase in FINAL_PHASES:
        return _after_finish(diagnosis, world.now)
    if status.phase in (DiagnosisPhase.NONE, DiagnosisPhase.PENDING):
        return Step(status=status)  # not started: start() decides
    problem = _pipeline_problem(diagnosis, world.pipeline)
    if problem is not None:
        return _finish(diagnosis, status, DiagnosisPhase.FAILED, *problem, now=world.now)
    pipeline = world.pipeline
    assert isinstance(pipeline, Pipeline)
    if diagnosis.metadata.labels.get(HASH_LABEL) != pipeline.hash:
        message = (
            f"OperationSet {diagnosis.spec.operation_set}'s specification has been changed during diagnosis execution"
        )
        return _finish(
            diagnosis,
            status,
            DiagnosisPhase.FAILED,
            DiagnosisConditionType.OPERATION_SET_CHANGED.value,
            message,
            now=world.now,
        )
    nodes = status.node_names
    if not nodes:
        return _finish(diagnosis, status, DiagnosisPhase.FAILED, NO_TARGETS, "status.nodeNames is empty", now=world.now)
    return _bounded(diagnosis, _Run(diagnosis, world, pipeline).walk(), world)


def _bounded(diagnosis: Diagnosis, step: Step, world: World) -> Step:
    """``step``, or the run ended by :func:`fail_too_large` if the status it writes would not fit.

    The run's bounds keep the status within ``world.object_limit``; this is the check that they did.
    """
    if step.status == diagnosis.status:
        return step
    after = _stamped(diagnosis, step)
    size = object_bytes(after)
    if size <= world.object_limit:
        return step
    return fail_too_large(after, too_large_message(after, size=size, limit=world.object_limit), now=world.now)


def fail_too_large(diagnosis: Diagnosis, message: str, *, now: datetime) -> Step:
    """``diagnosis`` ends Failed with ``StatusTooLarge`` and ``message``: its status as it is but without
    what made it too large (:func:`flows.diagnosis.size.shrunk`), so that this one can be written."""
    return _finish(diagnosis, shrunk(diagnosis.status), DiagnosisPhase.FAILED, STATUS_TOO_LARGE, message, now=now)


def progress_only(status: DiagnosisStatus, step: Step) -> bool:
    """Whether ``step`` (decided on ``status``) only counts more ended Tasks of the same stage, with their
    results: no other change of the status, no Event, the stage still waiting for some Tasks.

    Such a status need not be written at once: deciding again later, from the same Tasks, gives it (or a
    later one) back, so the controller may hold it back and write the progress of many Tasks at once.
    """
    new = step.status
    if step.notices or step.delete or status.checkpoint is None or new.checkpoint is None:
        return False
    was, now = status.checkpoint, new.checkpoint
    if (was.path_index, was.node_index) != (now.path_index, now.node_index) or now.active == 0:
        return False
    rest = msgspec.structs.replace(status, checkpoint=None, context=None)
    return rest == msgspec.structs.replace(new, checkpoint=None, context=None)


class _Run:
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
        step = _finish(self.diagnosis, self._status(), phase, reason, message, now=self.world.now)
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


def _pipeline_problem(diagnosis: Diagnosis, pipeline: Pipeline | BrokenGraph | None) -> tuple[str, str] | None:
    name = diagnosis.spec.operation_set
    if pipeline is None:
        return DiagnosisConditionType.OPERATION_SET_NOT_FOUND.value, f"OperationSet {name} is not found"
    if isinstance(pipeline, BrokenGraph):
        message = f"OperationSet {name} cannot run: {pipeline.message}"
        return DiagnosisConditionType.OPERATION_SET_NOT_READY.value, message
    return None


def _pods(diagnosis: Diagnosis) -> dict[str, PodReference]:
    text = diagnosis.metadata.annotations.get(PODS_ANNOTATION)
    if not text:
        return {}
    try:
        return msgspec.json.decode(text, type=dict[str, PodReference])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}  # edited by hand into something else: the Tasks just carry no pod


def _finish(
    diagnosis: Diagnosis, status: DiagnosisStatus, phase: DiagnosisPhase, reason: str, message: str, *, now: datetime
) -> Step:
    """``status`` ended in ``phase``, with a ``Complete`` condition (and KubeDiag's own for its reasons)."""
    conditions = status.conditions
    if reason in _KUBEDIAG_CONDITIONS:
        conditions = set_condition(
            conditions, Condition(type=reason, status=ConditionStatus.TRUE, reason=reason, message=message), now
        )
    succeeded = phase is DiagnosisPhase.SUCCEEDED
    complete = Condition(
        type=COMPLETE,
        status=ConditionStatus.TRUE if succeeded else ConditionStatus.FALSE,
        reason=reason,
        message=message,
    )
    cp = status.checkpoint
    if cp is not None:
        cp = msgspec.structs.replace(cp, active=0)
    ended = msgspec.structs.replace(
        status,
        phase=phase,
        conditions=set_condition(conditions, complete, now),
        start_time=status.start_time or format_time(now),
        checkpoint=cp,
    )
    notice = (
        Notice("Normal", "DiagnosisSucceeded", message)
        if succeeded
        else Notice("Warning", "DiagnosisFailed", f"{reason}: {message}")
    )
    step = _after_finish(msgspec.structs.replace(diagnosis, status=ended), now)
    return dataclasses.replace(step, notices=(notice,))


def _after_finish(diagnosis: Diagnosis, now: datetime) -> Step:
    """A finished Diagnosis waits for its ``ttlSecondsAfterFinished``, counted from when it finished."""
    status = diagnosis.status
    ttl = diagnosis.spec.ttl_seconds_after_finished
    if ttl is None:
        return Step(status=status)
    complete = find_condition(status.conditions, COMPLETE)
    finished = None
    for text in (complete.last_transition_time if complete else "", diagnosis.metadata.creation_timestamp):
        try:
            finished = parse_time(text)
            break
        except ValueError:
            continue
    if finished is None:
        return Step(status=status)
    due = finished + timedelta(seconds=ttl)
    return Step(status=status, due=None if now >= due else due, delete=now >= due)
