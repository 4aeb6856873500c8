"""A Diagnosis's Tasks: their names, ownership, request data and the Unknown verdict.

Names. A Task is named ``<diagnosis>.<uid[:8]>.<node>.<path>.<stage>.<operation>``, KubeDiag's
scheme, where ``<path>.<stage>`` is the position of the stage's action
(:func:`flows.diagnosis.paths.action_name`): the first path through the stage's prefix. A name is
thus a function of the Diagnosis, the node and the stage, so creating a stage's Tasks again (after a
lost answer, a restart or a new leader) finds them instead of duplicating them, and a stage a later
path shares is the same Task. A name that would pass 253 characters is cut and ends with a digest
of the whole, so it stays unique.

Ownership. Each Task has an ownerReference to its Diagnosis (the garbage collector deletes it with
the Diagnosis) and the finalizer :data:`TASK_FINALIZER`, which the controller removes only once
the Diagnosis is gone or being deleted: a Task cannot be deleted while its Diagnosis exists (the
design's rule, which KubeDiag's code does not follow).

Request data, what a processor receives, in this order, a later key replacing an earlier one
(:func:`request_data`):

1. the Diagnosis's ``spec.parameters``, which the hub reads from the Diagnosis when it sends the
   Task (the Task's ownerReference names it). They are not copied into the Task: a Diagnosis's
   parameters times its nodes times its stages would be that many copies in etcd and in the memory
   of the controller and of every hub; a Task created by an older controller has them in its own
   ``spec.parameters`` too, which changes nothing (the same values, applied again);
2. the results of the stages already passed on the Task's path, on the same node, each key
   ``k`` of a result of operation ``op`` as ``<op>.<k>`` (a node whose Task failed in a stage
   that passed under ``stagePolicy: Any`` contributes nothing for it; an operation that occurs
   twice on a path gives the later stage's values), read from the earlier Tasks themselves, or
   from the Diagnosis's ``status.context`` for a Task no longer there (the context may not hold
   every Task's results: :mod:`flows.diagnosis.context`);
3. the telemetry keys ``task.name``, ``task.namespace``, ``node``, and for a target reached through
   a pod ``pod.namespace``, ``pod.name`` and ``container``. ``task.uid`` is not known before the
   Task exists: the hub adds it when it dispatches the Task.

A Task's ``spec.parameters`` are 2 and 3 (:func:`task_parameters`).

KubeDiag HEAD stores results in the Diagnosis's context and never passes them on; its older
single-node version merged them into one flat map, where two operations' keys collide.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Final

import msgspec

from flows.diagnosis.conditions import set_condition
from flows.diagnosis.paths import PathFlow, Stage
from nodetask.clock import parse_time
from nodetask.names import MAX_SUBDOMAIN
from nodetask.phases import ConditionStatus
from schemas.diagnosis.v1 import (
    API_VERSION,
    Condition,
    Diagnosis,
    PodReference,
    Task,
    TaskConditionType,
    TaskPhase,
    TaskSpec,
)
from schemas.meta import ObjectMeta, OwnerReference

__all__ = [
    "DIAGNOSIS_UID_LABEL",
    "TASK_FINALIZER",
    "TIMED_OUT",
    "deadline",
    "is_final",
    "new_task",
    "owner_of",
    "request_data",
    "task_name",
    "task_parameters",
    "timed_out",
]

TASK_FINALIZER: Final = "diagnosis.kubediag.org/diagnosis"
"""Keeps a Task while its Diagnosis exists."""
DIAGNOSIS_UID_LABEL: Final = "diagnosis.kubediag.org/diagnosis-uid"
"""On each Task: the uid of its Diagnosis (a name may be too long for a label value)."""
TIMED_OUT: Final = "TimedOut"

_DIGEST: Final = 10


def task_name(diagnosis: Diagnosis, node: str, stage: Stage) -> str:
    """The Task of ``stage`` on ``node`` for ``diagnosis``: always the same name, at most 253 characters."""
    meta = diagnosis.metadata
    full = f"{meta.name}.{meta.uid[:8]}.{node}.{stage.first_path}.{stage.depth}.{stage.operation}"
    if len(full) <= MAX_SUBDOMAIN:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_DIGEST]
    # A prefix of a DNS subdomain is one once it ends in an alphanumeric character.
    head = full[: MAX_SUBDOMAIN - _DIGEST - 1].rstrip(".-")
    return f"{head}-{digest}"


def owner_of(task: Task) -> OwnerReference | None:
    """The Diagnosis owning ``task``, or None."""
    return next(
        (o for o in task.metadata.owner_references if o.kind == "Diagnosis" and o.api_version == API_VERSION), None
    )


def request_data(diagnosis_parameters: Mapping[str, str], task_parameters: Mapping[str, str]) -> dict[str, str]:
    """What a Task's processor receives (``task.uid`` apart): its Diagnosis's parameters, then its own."""
    return {**diagnosis_parameters, **task_parameters}


def task_parameters(
    diagnosis: Diagnosis,
    plan: PathFlow,
    *,
    path_index: int,
    node_index: int,
    node: str,
    pod: PodReference | None,
    results: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """The ``spec.parameters`` of the Task of stage ``node_index`` of path ``path_index`` on ``node``: what
    it adds to the Diagnosis's parameters (the earlier stages' results, the telemetry keys).

    ``results`` are the succeeded Tasks' results by Task name; a Task not in it is looked up in the
    Diagnosis's ``status.context.operations`` (see the module docstring).
    """
    data: dict[str, str] = {}
    context = diagnosis.status.context
    operations = context.operations if context is not None else {}
    for depth in range(node_index):
        earlier = plan.stage(plan.action_at(path_index, depth))
        name = task_name(diagnosis, node, earlier)
        found = results.get(name) if results is not None else None
        if found is None:
            found = operations.get(earlier.operation, {}).get(name, {})
        data.update((f"{earlier.operation}.{key}", value) for key, value in found.items())
    stage = plan.stage(plan.action_at(path_index, node_index))
    data["task.name"] = task_name(diagnosis, node, stage)
    data["task.namespace"] = diagnosis.metadata.namespace
    data["node"] = node
    if pod is not None:
        data["pod.namespace"] = pod.namespace
        data["pod.name"] = pod.name
        data["container"] = pod.container
    return data


def new_task(
    diagnosis: Diagnosis,
    plan: PathFlow,
    *,
    path_index: int,
    node_index: int,
    node: str,
    pod: PodReference | None,
    results: Mapping[str, Mapping[str, str]] | None = None,
) -> Task:
    """The Task to create for a stage on ``node``: owned by ``diagnosis``, kept by its finalizer; its
    ``spec.parameters`` are :func:`task_parameters`'s."""
    meta = diagnosis.metadata
    stage = plan.stage(plan.action_at(path_index, node_index))
    owner = OwnerReference(api_version=API_VERSION, kind="Diagnosis", name=meta.name, uid=meta.uid, controller=True)
    return Task(
        metadata=ObjectMeta(
            name=task_name(diagnosis, node, stage),
            namespace=meta.namespace,
            labels={DIAGNOSIS_UID_LABEL: meta.uid} if meta.uid else {},
            finalizers=(TASK_FINALIZER,),
            owner_references=(owner,),
        ),
        spec=TaskSpec(
            operation=stage.operation,
            node_name=node,
            pod_reference=pod,
            parameters=task_parameters(
                diagnosis, plan, path_index=path_index, node_index=node_index, node=node, pod=pod, results=results
            ),
        ),
    )


def is_final(phase: TaskPhase) -> bool:
    """Succeeded, Failed and Unknown end a Task; its stage counts it then, once."""
    return phase in (TaskPhase.SUCCEEDED, TaskPhase.FAILED, TaskPhase.UNKNOWN)


def deadline(task: Task, timeout_seconds: int) -> datetime | None:
    """When a Task without a result becomes Unknown: its operation's timeout after its dispatch.

    Dispatch is ``status.startTime`` (written by the hub that sent it), else the Task's creation: a
    Task no hub takes (its node has no agent, or is not connected) times out all the same. None for
    a Task that has ended, or has no time that parses (then it is not timed out at all, rather
    than at once).
    """
    if is_final(task.status.phase):
        return None
    for text in (task.status.start_time, task.metadata.creation_timestamp):
        if text:
            try:
                return parse_time(text) + timedelta(seconds=timeout_seconds)
            except ValueError:
                continue
    return None


def timed_out(task: Task, *, timeout_seconds: int, now: datetime) -> Task | None:
    """``task`` made Unknown if it is past its deadline without a result; None if it is not (or ended)."""
    due = deadline(task, timeout_seconds)
    if due is None or now < due:
        return None
    condition = Condition(
        type=TaskConditionType.FAILED.value,
        status=ConditionStatus.TRUE,
        reason=TIMED_OUT,
        message=f"no result within the operation's timeout of {timeout_seconds} s from dispatch",
    )
    status = msgspec.structs.replace(
        task.status, phase=TaskPhase.UNKNOWN, conditions=set_condition(task.status.conditions, condition, now)
    )
    return msgspec.structs.replace(task, status=status)
