"""``diagnosis.kubediag.org/v1``: KubeDiag's Operation, OperationSet, Diagnosis and Task.

JSON keys are KubeDiag's. A Diagnosis's targets may be spelled as in KubeDiag's design
(``targetNodeSelector``, ``targetNodeNames``, ``targetPodSelector``, ``targetPodNames``) or as in its
code at HEAD (``nodeSelector``, ``nodeNames``, ``podSelector``, ``podReferences``), so manifests of
either apply unchanged; :meth:`TargetSelector.targets` reads both the same way. KubeDiag's v1
single-target fields (``spec.nodeName``, ``spec.podReference``, as its published samples still write
them) are read as a one-element ``nodeNames`` or ``podReferences`` (:meth:`DiagnosisSpec.targets`). KubeDiag's
``function`` processor (images built with Docker on the node) decodes so that such an Operation
gets a clear refusal from validation instead of a decode error. Fields KubeDiag declares but never
uses (``dependences`` and ``storage`` of an Operation) are ignored, as the API server prunes them.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

import msgspec

from schemas.meta import ApiStruct, ConditionStatus, LabelSelector, ObjectMeta
from schemas.processors import Processor

GROUP: Final = "diagnosis.kubediag.org"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

TELEMETRY_KEYS: Final = ("task.name", "task.namespace", "task.uid", "node", "pod.namespace", "pod.name", "container")
"""Request keys nodetaskd sets for every task (KubeDiag's), so a Diagnosis parameter may not use them."""

MAX_PARAMETERS_BYTES: Final = 64 * 1024
"""The most a Diagnosis's ``spec.parameters`` may take as JSON. Every Task of the Diagnosis gets them
(the hub reads them from the Diagnosis when it sends a Task), and its status keeps a copy."""
DEFAULT_MAX_TARGETS: Final = 5000
"""How many target nodes (or pod references) a Diagnosis may have unless the controller's
``diagnosisMaxTargets`` says otherwise: each is a Task per stage."""


def parameters_bytes(parameters: object) -> int:
    """The size of ``parameters`` (a Diagnosis's ``spec.parameters``, or any JSON value) as JSON."""
    return len(msgspec.json.encode(parameters))


Seconds = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1, extra_json_schema={"format": "int32"})]


class DiagnosisPhase(enum.StrEnum):
    """``status.phase`` of a Diagnosis."""

    NONE = ""
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class TaskPhase(enum.StrEnum):
    """``status.phase`` of a Task; Unknown is a node that stayed silent past the operation's timeout."""

    NONE = ""
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class StagePolicy(enum.StrEnum):
    """When a stage passes: All of its Tasks succeeded (the design's rule), or Any (KubeDiag's code)."""

    ALL = "All"
    ANY = "Any"


class DiagnosisConditionType(enum.StrEnum):
    """KubeDiag's Diagnosis condition types."""

    ACCEPTED = "Accepted"
    COMPLETE = "Complete"
    OPERATION_SET_CHANGED = "OperationSetChanged"
    OPERATION_SET_NOT_READY = "OperationSetNotReady"
    OPERATION_SET_NOT_FOUND = "OperationSetNotFound"
    OPERATION_NOT_FOUND = "OperationNotFound"


class TaskConditionType(enum.StrEnum):
    """KubeDiag's Task condition types: Accepted, then Complete or Failed."""

    ACCEPTED = "Accepted"
    COMPLETE = "Complete"
    FAILED = "Failed"
    OPERATION_NOT_FOUND = "OperationNotFound"


class Condition(ApiStruct, frozen=True):
    """A Diagnosis, Task or OperationSet condition (KubeDiag's DiagnosisCondition shape)."""

    type: str
    status: ConditionStatus
    last_transition_time: str = ""
    reason: str = ""
    message: str = ""


class PodReference(ApiStruct, frozen=True):
    """A pod, and optionally one of its containers."""

    namespace: str
    name: str
    container: str = ""


# ---------------------------------------------------------------------------------------------- Operation


class OperationSpec(ApiStruct, frozen=True):
    processor: Processor


class Operation(ApiStruct, frozen=True, kw_only=True):
    """One diagnosis step: what a Task runs on its node (cluster-scoped)."""

    api_version: str = API_VERSION
    kind: str = "Operation"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: OperationSpec


# ---------------------------------------------------------------------------------------------- OperationSet


class AdjacencyNode(ApiStruct, frozen=True):
    """A graph node: id (its list position), operation (none for the start node 0) and successors."""

    id: int | None = None
    to: tuple[int, ...] = ()
    operation: str = ""
    dependences: tuple[int, ...] = ()
    """KubeDiag's; unused there too."""


Path = tuple[AdjacencyNode, ...]
"""A diagnosis path as KubeDiag stores it: copies of the graph nodes after the start, in order."""


class OperationSetSpec(ApiStruct, frozen=True):
    adjacency_list: tuple[AdjacencyNode, ...]


class OperationSetStatus(ApiStruct, frozen=True, omit_defaults=False):
    """Every start-to-sink path, in the order they are tried; ready once they match the spec."""

    paths: tuple[Path, ...] = ()
    ready: bool = False
    conditions: tuple[Condition, ...] = ()


class OperationSet(ApiStruct, frozen=True, kw_only=True):
    """A diagnosis pipeline: a graph of Operations from a start node (cluster-scoped)."""

    api_version: str = API_VERSION
    kind: str = "OperationSet"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: OperationSetSpec
    status: OperationSetStatus = msgspec.field(default_factory=OperationSetStatus)


# ---------------------------------------------------------------------------------------------- Diagnosis


class Targets(msgspec.Struct, frozen=True, kw_only=True):
    """A Diagnosis's targets with either spelling resolved (not a wire type)."""

    node_selector: LabelSelector | None = None
    node_names: tuple[str, ...] = ()
    pod_selector: LabelSelector | None = None
    pod_references: tuple[PodReference, ...] = ()


class TargetSelector(ApiStruct, frozen=True):
    """Where a Diagnosis's Tasks run, in the design's keys (target...) or KubeDiag HEAD's."""

    target_node_selector: LabelSelector | None = None
    target_node_names: tuple[str, ...] = ()
    target_pod_selector: LabelSelector | None = None
    target_pod_names: tuple[PodReference, ...] = ()
    node_selector: LabelSelector | None = None
    node_names: tuple[str, ...] = ()
    pod_selector: LabelSelector | None = None
    pod_references: tuple[PodReference, ...] = ()

    def targets(self) -> Targets:
        """The targets whichever spelling set them; validation admits only one spelling per target."""
        return Targets(
            node_selector=self.target_node_selector if self.target_node_selector is not None else self.node_selector,
            node_names=self.target_node_names or self.node_names,
            pod_selector=self.target_pod_selector if self.target_pod_selector is not None else self.pod_selector,
            pod_references=self.target_pod_names or self.pod_references,
        )


class DiagnosisSpec(ApiStruct, frozen=True):
    operation_set: str
    parameters: dict[str, str] = {}
    target_selector: TargetSelector | None = None
    stage_policy: StagePolicy = StagePolicy.ALL
    ttl_seconds_after_finished: Seconds | None = None
    node_name: str = ""
    """KubeDiag v1's single target node (its samples' spelling): the same as ``targetSelector.nodeNames: [it]``."""
    pod_reference: PodReference | None = None
    """KubeDiag v1's single target pod: the same as ``targetSelector.podReferences: [it]``."""

    def targets(self) -> Targets:
        """The targets however they are spelled; validation admits one kind of target only, so one applies."""
        if self.target_selector is not None:
            return self.target_selector.targets()
        if self.pod_reference is not None:
            return Targets(pod_references=(self.pod_reference,))
        if self.node_name:
            return Targets(node_names=(self.node_name,))
        return Targets()


class Checkpoint(ApiStruct, frozen=True, omit_defaults=False):
    """Where a run is: the path and stage, and the counts of the stage's Tasks, each counted once."""

    path_index: int = 0
    node_index: int = 0
    desired: int = 0
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    synchronized_tasks: tuple[str, ...] | msgspec.UnsetType = msgspec.UNSET
    """KubeDiag's record of the counted Tasks, their names: read from a status an older controller wrote,
    never written (it grows with the targets past what etcd stores). Unset, it is left out, as by Go's
    omitempty."""
    synchronized_nodes: str | msgspec.UnsetType = msgspec.UNSET
    """The counted Tasks as one bit per target node, in base64 (:mod:`flows.diagnosis.counted`); left out
    while none is counted."""


class DiagnosisContext(ApiStruct, frozen=True):
    """The run's parameters and every Task's results: ``operations.<operation>.<task> = results``."""

    parameters: dict[str, str] = {}
    operations: dict[str, dict[str, dict[str, str]]] = {}


class DiagnosisStatus(ApiStruct, frozen=True):
    phase: DiagnosisPhase = DiagnosisPhase.NONE
    conditions: tuple[Condition, ...] = ()
    start_time: str = ""
    failed_paths: tuple[Path, ...] = ()
    succeeded_path: Path = ()
    checkpoint: Checkpoint | None = None
    node_names: tuple[str, ...] = ()
    context: DiagnosisContext | None = None


class Diagnosis(ApiStruct, frozen=True, kw_only=True):
    """One run of an OperationSet over a set of nodes (namespaced)."""

    api_version: str = API_VERSION
    kind: str = "Diagnosis"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: DiagnosisSpec
    status: DiagnosisStatus = msgspec.field(default_factory=DiagnosisStatus)


class ParametersSpec(ApiStruct, frozen=True):
    parameters: dict[str, str] = {}


class DiagnosisParameters(ApiStruct, frozen=True, kw_only=True):
    """A Diagnosis read for its parameters only, what a hub needs to send its Tasks: the rest of it (its
    status above all, which may hold thousands of node names and results) is skipped while decoding."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ParametersSpec = msgspec.field(default_factory=ParametersSpec)


# ---------------------------------------------------------------------------------------------- Task


class TaskSpec(ApiStruct, frozen=True):
    operation: str
    node_name: str = ""
    pod_reference: PodReference | None = None
    parameters: dict[str, str] = {}


class TaskStatus(ApiStruct, frozen=True):
    phase: TaskPhase = TaskPhase.NONE
    conditions: tuple[Condition, ...] = ()
    start_time: str = ""
    results: dict[str, str] = {}


class Task(ApiStruct, frozen=True, kw_only=True):
    """One Operation run on one node for a Diagnosis (namespaced)."""

    api_version: str = API_VERSION
    kind: str = "Task"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: TaskSpec
    status: TaskStatus = msgspec.field(default_factory=TaskStatus)


DiagnosisObject = Operation | OperationSet | Diagnosis | Task
