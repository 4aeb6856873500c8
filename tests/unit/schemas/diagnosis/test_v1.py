"""KubeDiag's diagnosis.kubediag.org/v1 objects decode into the API types with KubeDiag's keys."""

from __future__ import annotations

import msgspec
import pytest

from nodetask.phases import ConditionStatus
from schemas import processors
from schemas.diagnosis import v1 as diagnosis
from schemas.diagnosis.kinds import DIAGNOSIS, DIAGNOSIS_KINDS, DIAGNOSIS_TASK, OPERATION, OPERATION_SET
from schemas.diagnosis.manifest import decode_diagnosis_object, diagnosis_kind_of
from schemas.diagnosis.v1 import (
    Diagnosis,
    DiagnosisPhase,
    Operation,
    OperationSet,
    PodReference,
    StagePolicy,
    Task,
    TaskPhase,
)
from schemas.kinds import KINDS
from schemas.manifest import ManifestError, decode_job
from schemas.meta import LabelSelector

HTTP_OPERATION = b"""
apiVersion: diagnosis.kubediag.org/v1
kind: Operation
metadata:
  name: pod-list-collector
spec:
  processor:
    httpServer:
      address: 10.0.0.7
      port: 8090
      path: /processor/podListCollector
      scheme: http
    timeoutSeconds: 60
"""

SCRIPT_OPERATION = b"""
apiVersion: diagnosis.kubediag.org/v1
kind: Operation
metadata:
  name: disk-usage
spec:
  processor:
    scriptRunner:
      script: |
        #!/bin/sh
        du -sh "$1"
      argKeys:
      - param.operation.disk_usage.path
      operationResultKey: disk_usage
"""

FUNCTION_OPERATION = b"""
apiVersion: diagnosis.kubediag.org/v1
kind: Operation
metadata:
  name: hello
spec:
  processor:
    function:
      runtime: python3
      codeSource:
        handler.py: "def handle(req): return req"
"""

OPERATION_SET_MANIFEST = b"""
apiVersion: diagnosis.kubediag.org/v1
kind: OperationSet
metadata:
  name: pod-list-collector
spec:
  adjacencyList:
  - id: 0
    to:
    - 1
    - 2
  - id: 1
    operation: pod-list-collector
    to:
    - 2
  - id: 2
    operation: disk-usage
status:
  ready: true
  paths:
  - - id: 1
      operation: pod-list-collector
      to: [2]
    - id: 2
      operation: disk-usage
  - - id: 2
      operation: disk-usage
"""

HEAD_DIAGNOSIS = b"""
apiVersion: diagnosis.kubediag.org/v1
kind: Diagnosis
metadata:
  name: collect
  namespace: default
spec:
  operationSet: pod-list-collector
  parameters:
    param.operation.disk_usage.path: /var/lib
  targetSelector:
    nodeSelector:
      matchLabels:
        node-role.kubernetes.io/edge: ""
    nodeNames: [edge-1, edge-2]
    podSelector:
      matchExpressions:
      - {key: app, operator: In, values: [web]}
    podReferences:
    - {namespace: default, name: web-0, container: nginx}
"""

DESIGN_DIAGNOSIS = b"""
apiVersion: diagnosis.kubediag.org/v1
kind: Diagnosis
metadata:
  name: collect
  namespace: default
spec:
  operationSet: pod-list-collector
  parameters:
    param.operation.disk_usage.path: /var/lib
  targetSelector:
    targetNodeSelector:
      matchLabels:
        node-role.kubernetes.io/edge: ""
    targetNodeNames: [edge-1, edge-2]
    targetPodSelector:
      matchExpressions:
      - {key: app, operator: In, values: [web]}
    targetPodNames:
    - {namespace: default, name: web-0, container: nginx}
"""

DIAGNOSIS_WITH_STATUS = b"""
{"apiVersion": "diagnosis.kubediag.org/v1", "kind": "Diagnosis",
 "metadata": {"name": "collect", "namespace": "default", "uid": "0a1b2c3d-0000"},
 "spec": {"operationSet": "pod-list-collector", "targetSelector": {"nodeNames": ["edge-1"]},
          "stagePolicy": "Any", "ttlSecondsAfterFinished": 600},
 "status": {"phase": "Running", "startTime": "2026-01-02T03:04:05Z",
   "conditions": [{"type": "Accepted", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z",
                   "reason": "DiagnosisAccepted", "message": "accepted"}],
   "failedPaths": [[{"id": 1, "operation": "pod-list-collector", "to": [2]}]],
   "succeededPath": [{"id": 2, "operation": "disk-usage"}],
   "checkpoint": {"pathIndex": 1, "nodeIndex": 0, "desired": 1, "active": 0, "succeeded": 1, "failed": 0,
                  "synchronizedTasks": ["collect.0a1b2c3d.edge-1.1.0.disk-usage"]},
   "nodeNames": ["edge-1"],
   "context": {"parameters": {"a": "b"},
               "operations": {"disk-usage": {"collect.0a1b2c3d.edge-1.1.0.disk-usage": {"size": "3G"}}}}}}
"""

TASK_MANIFEST = b"""
apiVersion: diagnosis.kubediag.org/v1
kind: Task
metadata:
  name: collect.0a1b2c3d.edge-1.0.0.pod-list-collector
  namespace: default
  labels:
    diagnosis-namespace: default
    diagnosis-name: collect
  ownerReferences:
  - apiVersion: diagnosis.kubediag.org/v1
    kind: Diagnosis
    name: collect
    uid: 0a1b2c3d-0000
spec:
  operation: pod-list-collector
  nodeName: edge-1
  podReference: {namespace: default, name: web-0}
  parameters:
    a: b
status:
  phase: Succeeded
  startTime: "2026-01-02T03:04:05Z"
  conditions:
  - type: Accepted
    status: "True"
    reason: TaskAccepted
    message: Task is accepted by agent on node edge-1
  - type: Complete
    status: "True"
  results:
    collector.kubernetes.pod.list: "[]"
"""


def test_kubediag_http_operation_decodes() -> None:
    """An Operation with an httpServer processor decodes with its address, port, path and timeout."""
    op = decode_diagnosis_object(HTTP_OPERATION, fmt="yaml")
    assert isinstance(op, Operation)
    server = op.spec.processor.http_server
    assert server is not None
    assert (server.address, server.port, server.path, server.scheme) == (
        "10.0.0.7",
        8090,
        "/processor/podListCollector",
        "http",
    )
    assert op.spec.processor.timeout_seconds == 60


def test_kubediag_script_operation_decodes_with_the_default_timeout() -> None:
    """A scriptRunner Operation keeps its argKeys in order; an absent timeout is KubeDiag's 30 seconds."""
    op = decode_diagnosis_object(SCRIPT_OPERATION, fmt="yaml")
    assert isinstance(op, Operation)
    runner = op.spec.processor.script_runner
    assert runner is not None
    assert runner.script.startswith("#!/bin/sh\n")
    assert runner.arg_keys == ("param.operation.disk_usage.path",)
    assert runner.operation_result_key == "disk_usage"
    assert op.spec.processor.timeout_seconds == processors.DEFAULT_TIMEOUT_SECONDS == 30


def test_kubediag_function_operation_decodes_so_validation_can_refuse_it() -> None:
    """KubeDiag's function processor decodes (validation, not the decoder, says it is unsupported)."""
    op = decode_diagnosis_object(FUNCTION_OPERATION, fmt="yaml")
    assert isinstance(op, Operation)
    assert op.spec.processor.function is not None
    assert op.spec.processor.function.runtime == "python3"


def test_kubediag_operation_set_decodes_with_its_paths() -> None:
    """An OperationSet decodes its adjacency list and status paths as full node copies."""
    opset = decode_diagnosis_object(OPERATION_SET_MANIFEST, fmt="yaml")
    assert isinstance(opset, OperationSet)
    nodes = opset.spec.adjacency_list
    assert [(n.id, n.to, n.operation) for n in nodes] == [
        (0, (1, 2), ""),
        (1, (2,), "pod-list-collector"),
        (2, (), "disk-usage"),
    ]
    assert opset.status.ready is True
    assert [[n.operation for n in path] for path in opset.status.paths] == [
        ["pod-list-collector", "disk-usage"],
        ["disk-usage"],
    ]


def test_operation_set_status_always_says_whether_it_is_ready() -> None:
    """status.ready is written even when false, as KubeDiag's (not omitempty) field is."""
    opset = decode_diagnosis_object(OPERATION_SET_MANIFEST, fmt="yaml")
    assert isinstance(opset, OperationSet)
    unready = msgspec.structs.replace(opset, status=diagnosis.OperationSetStatus())
    encoded = msgspec.json.decode(msgspec.json.encode(unready))
    assert encoded["status"]["ready"] is False


def test_head_and_design_spellings_of_targets_decode_to_the_same_targets() -> None:
    """KubeDiag HEAD's nodeSelector/nodeNames/podSelector/podReferences equal the design's target... keys."""
    head = decode_diagnosis_object(HEAD_DIAGNOSIS, fmt="yaml")
    design = decode_diagnosis_object(DESIGN_DIAGNOSIS, fmt="yaml")
    assert isinstance(head, Diagnosis)
    assert isinstance(design, Diagnosis)
    assert head.spec.target_selector is not None
    assert design.spec.target_selector is not None
    targets = head.spec.target_selector.targets()
    assert targets == design.spec.target_selector.targets()
    assert targets.node_names == ("edge-1", "edge-2")
    assert targets.node_selector == LabelSelector(match_labels={"node-role.kubernetes.io/edge": ""})
    assert targets.pod_selector is not None
    assert targets.pod_selector.matches({"app": "web"})
    assert targets.pod_references == (PodReference(namespace="default", name="web-0", container="nginx"),)
    assert head.spec.parameters == {"param.operation.disk_usage.path": "/var/lib"}
    assert head.spec.stage_policy is StagePolicy.ALL


def test_diagnosis_status_round_trips_with_kubediag_keys() -> None:
    """A Diagnosis with every status field decodes, and re-encodes with exactly the same keys."""
    diag = decode_diagnosis_object(DIAGNOSIS_WITH_STATUS)
    assert isinstance(diag, Diagnosis)
    status = diag.status
    assert status.phase is DiagnosisPhase.RUNNING
    assert status.conditions[0].status is ConditionStatus.TRUE
    assert status.checkpoint is not None
    assert (status.checkpoint.path_index, status.checkpoint.succeeded) == (1, 1)
    assert status.context is not None
    assert status.context.operations["disk-usage"]["collect.0a1b2c3d.edge-1.1.0.disk-usage"] == {"size": "3G"}
    assert diag.spec.stage_policy is StagePolicy.ANY
    assert diag.spec.ttl_seconds_after_finished == 600
    assert msgspec.json.decode(msgspec.json.encode(diag)) == msgspec.json.decode(DIAGNOSIS_WITH_STATUS)


def test_kubediag_task_decodes() -> None:
    """A Task as KubeDiag's master creates it, with results, decodes."""
    task = decode_diagnosis_object(TASK_MANIFEST, fmt="yaml")
    assert isinstance(task, Task)
    assert task.spec.operation == "pod-list-collector"
    assert task.spec.node_name == "edge-1"
    assert task.spec.pod_reference == PodReference(namespace="default", name="web-0")
    assert task.status.phase is TaskPhase.SUCCEEDED
    assert [c.type for c in task.status.conditions] == ["Accepted", "Complete"]
    assert task.status.results == {"collector.kubernetes.pod.list": "[]"}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b'{"apiVersion": "diagnosis.kubediag.org/v1", "kind": "Diagnosis", "spec": {}}', "operationSet"),
        (
            b'{"apiVersion": "diagnosis.kubediag.org/v1", "kind": "Operation", '
            b'"spec": {"processor": {"timeoutSeconds": 0}}}',
            "$.spec.processor.timeoutSeconds",
        ),
        (
            b'{"apiVersion": "diagnosis.kubediag.org/v1", "kind": "Task", "spec": {"operation": "a", '
            b'"podReference": {"name": "p"}}}',
            "$.spec.podReference",
        ),
        (b'{"apiVersion": "diagnosis.kubediag.org/v2", "kind": "Task"}', "served at version 'v1' only"),
        (b'{"apiVersion": "diagnosis.kubediag.org/v1", "kind": "Trigger"}', "not a diagnosis kind"),
        (b'{"apiVersion": "operations.kubeedge.io/v1alpha2", "kind": "Task"}', "not in the diagnosis.kubediag.org"),
    ],
)
def test_malformed_objects_are_errors_naming_the_field(document: bytes, message: str) -> None:
    """A missing required field, a value out of range or an unknown kind is an error naming it."""
    with pytest.raises(ManifestError, match=message.replace("$", r"\$").replace(".", r"\.")):
        decode_diagnosis_object(document)


def test_node_job_decoding_still_refuses_diagnosis_kinds() -> None:
    """decode_job stays for node jobs: a diagnosis object is not one."""
    with pytest.raises(ManifestError, match=r"not in the operations\.kubeedge\.io group"):
        decode_job(TASK_MANIFEST, fmt="yaml")


def test_diagnosis_kinds_are_described_apart_from_the_node_jobs() -> None:
    """Four kinds, their scopes and short names; none of them joins the node jobs' KINDS."""
    assert [k.kind for k in DIAGNOSIS_KINDS] == ["Operation", "OperationSet", "Diagnosis", "Task"]
    assert [k.namespaced for k in DIAGNOSIS_KINDS] == [False, False, True, True]
    assert [k.crd_name for k in DIAGNOSIS_KINDS] == [
        "operations.diagnosis.kubediag.org",
        "operationsets.diagnosis.kubediag.org",
        "diagnoses.diagnosis.kubediag.org",
        "tasks.diagnosis.kubediag.org",
    ]
    assert not {k.kind for k in DIAGNOSIS_KINDS} & {k.kind for k in KINDS}
    assert diagnosis_kind_of("diagnosis.kubediag.org/v1", "Task") is DIAGNOSIS_TASK
    assert (OPERATION.object_type, OPERATION_SET.object_type, DIAGNOSIS.object_type) == (
        Operation,
        OperationSet,
        Diagnosis,
    )
