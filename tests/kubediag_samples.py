"""KubeDiag's published sample manifests, as the unit and integration tests of its compatibility apply them."""

from __future__ import annotations

from typing import Final

HTTP_OPERATION_SET: Final = """\
apiVersion: diagnosis.kubediag.org/v1
kind: OperationSet
metadata:
  name: http-operation
spec:
  adjacencyList:
  - id: 0
    to:
    - 1
  - id: 1
    operation: http-operation
"""
"""KubeDiag's samples/http-operation/manifests/operationset.yaml, unchanged."""

HTTP_OPERATION_DIAGNOSIS: Final = """\
apiVersion: diagnosis.kubediag.org/v1
kind: Diagnosis
metadata:
  name: http-operation
spec:
  operationSet: http-operation
  nodeName: my-node
  parameters:
    b: "200"
    f: "6"
"""
"""KubeDiag's samples/http-operation/manifests/diagnosis.yaml, unchanged: nodetaskd serves KubeDiag's own group
and version (diagnosis.kubediag.org/v1), so nothing needs adapting."""

POD_REFERENCE_DIAGNOSIS: Final = """
apiVersion: diagnosis.kubediag.org/v1
kind: Diagnosis
metadata:
  name: pod-reference
  namespace: default
spec:
  operationSet: pod-collection
  podReference:
    namespace: default
    name: liveness-exec
    container: liveness
"""
"""A Diagnosis with KubeDiag v1's ``spec.podReference`` (namespace, name and container, as its DiagnosisSpec
documents them)."""
