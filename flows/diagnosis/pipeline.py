"""An OperationSet as the controller uses it: the hash of its graph, its paths compiled, its status.

The hash identifies the graph a Diagnosis runs: the controller stamps it on the Diagnosis when the
run starts (label :data:`HASH_LABEL`) and fails the run with ``OperationSetChanged`` when the
OperationSet's graph no longer has it. It covers what decides the run (each node's operation and
successors, in order), not the ids the defaulting webhook fills in nor KubeDiag's unused
``dependences``, so defaulting a stored object does not count as a change.

A Diagnosis compiles its paths from the same copy of the spec it hashed, never from
``status.paths``: the status is written by another pass and may lag behind a changed spec, and a run
must never go on with paths of an older graph under the newer hash. Both come from
:func:`schemas.diagnosis.graph.status_paths`, so they are the same paths.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import msgspec

from flows.diagnosis.conditions import find_condition, set_condition
from flows.diagnosis.paths import PathFlow, compile_paths
from nodetask.phases import ConditionStatus
from schemas.diagnosis import graph as diagnosis_graph
from schemas.diagnosis.v1 import AdjacencyNode, Condition, OperationSet, OperationSetStatus, Path

__all__ = [
    "HASH_LABEL",
    "READY_CONDITION",
    "STATUS_TOO_LARGE",
    "BrokenGraph",
    "Pipeline",
    "adjacency_hash",
    "operation_set_status",
    "pipeline_of",
    "refused_as_too_large",
    "too_large_status",
]

HASH_LABEL: Final = "diagnosis.kubediag.org/adjacency-list-hash"
"""On an OperationSet: the hash of its graph; on a Diagnosis: the hash of the graph its run started on."""
READY_CONDITION: Final = "Ready"
STATUS_TOO_LARGE: Final = "StatusTooLarge"
"""The reason an OperationSet is not ready when the API server refused its paths for their size."""


def adjacency_hash(nodes: Sequence[AdjacencyNode]) -> str:
    """A label value naming the graph: 16 hex digits of the SHA-256 of each node's operation and successors."""
    canonical = msgspec.json.encode([[node.operation, list(node.to)] for node in nodes])
    return hashlib.sha256(canonical).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A valid graph: its hash, its paths as ``status.paths`` holds them, and the flow trying them."""

    hash: str
    paths: tuple[Path, ...]
    plan: PathFlow
    paths_bytes: int = 0
    """The paths as JSON: the most a run's failed and passed paths take in its status."""


@dataclass(frozen=True, slots=True)
class BrokenGraph:
    """A graph no Diagnosis can run, and why."""

    hash: str
    problems: tuple[str, ...]
    """Each problem with the field it is at, e.g. ``spec.adjacencyList[3]: node 3 (x) is not reachable ...``."""

    @property
    def message(self) -> str:
        return "; ".join(self.problems)


def pipeline_of(operation_set: OperationSet) -> Pipeline | BrokenGraph:
    """The OperationSet's graph checked, its paths enumerated and compiled into one flow."""
    nodes = operation_set.spec.adjacency_list
    digest = adjacency_hash(nodes)
    problems = diagnosis_graph.problems(nodes)
    if problems:
        return BrokenGraph(digest, tuple(f"{p.path()}: {p.message}" for p in problems))
    paths = diagnosis_graph.status_paths(nodes)
    try:
        plan = compile_paths(paths, name=operation_set.metadata.name or "diagnosis")
    except ValueError as exc:  # not for a graph problems() accepts; kept as data all the same
        return BrokenGraph(digest, (f"spec.adjacencyList: {exc}",))
    return Pipeline(digest, paths, plan, len(msgspec.json.encode(paths)))


def operation_set_status(operation_set: OperationSet, *, now: datetime) -> tuple[str, OperationSetStatus]:
    """The graph's hash and the status the OperationSet should have.

    Ready with every path, or not ready without paths and a ``Ready`` False condition naming each bad
    node (KubeDiag writes nothing and retries forever). A condition keeps its transition time while
    its status stays the same, so an unchanged OperationSet gets the status it already has.
    """
    pipeline = pipeline_of(operation_set)
    current = operation_set.status
    if isinstance(pipeline, BrokenGraph):
        condition = Condition(
            type=READY_CONDITION, status=ConditionStatus.FALSE, reason="InvalidGraph", message=pipeline.message
        )
        status = OperationSetStatus(paths=(), ready=False, conditions=set_condition(current.conditions, condition, now))
    else:
        count = len(pipeline.paths)
        condition = Condition(
            type=READY_CONDITION,
            status=ConditionStatus.TRUE,
            reason="PathsFound",
            message=f"{count} path{'' if count == 1 else 's'} from the start node to a last node",
        )
        status = OperationSetStatus(
            paths=pipeline.paths, ready=True, conditions=set_condition(current.conditions, condition, now)
        )
    return pipeline.hash, status


def too_large_status(operation_set: OperationSet, message: str, *, now: datetime) -> OperationSetStatus:
    """The status of an OperationSet whose paths the API server refused to store: not ready, saying why.

    The graph's own checks bound its paths (:data:`schemas.diagnosis.graph.MAX_PATHS_BYTES`); this is
    for a status refused all the same (a spec so large that little room is left beside it).
    """
    condition = Condition(type=READY_CONDITION, status=ConditionStatus.FALSE, reason=STATUS_TOO_LARGE, message=message)
    return OperationSetStatus(
        paths=(), ready=False, conditions=set_condition(operation_set.status.conditions, condition, now)
    )


def refused_as_too_large(operation_set: OperationSet, digest: str) -> bool:
    """Whether the status of ``operation_set``, whose graph has hash ``digest``, was refused for its size:
    the same graph's status would be refused again, so it is not written again."""
    ready = find_condition(operation_set.status.conditions, READY_CONDITION)
    return (
        ready is not None
        and ready.reason == STATUS_TOO_LARGE
        and operation_set.metadata.labels.get(HASH_LABEL) == digest
    )
