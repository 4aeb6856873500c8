"""KubeDiag's diagnosis kinds (``diagnosis.kubediag.org/v1``), described once as :mod:`schemas.kinds` does the jobs'."""

from __future__ import annotations

from typing import Final

import msgspec

from schemas.diagnosis import v1 as diagnosis

__all__ = [
    "DIAGNOSIS",
    "DIAGNOSIS_CATEGORY",
    "DIAGNOSIS_KINDS",
    "DIAGNOSIS_TASK",
    "OPERATION",
    "OPERATION_SET",
    "DiagnosisKind",
]


class DiagnosisKind(msgspec.Struct, frozen=True, kw_only=True):
    """Static facts about one ``diagnosis.kubediag.org`` kind (one served version, ``v1``)."""

    kind: str
    """``OperationSet``."""
    plural: str
    """``operationsets``: the REST resource name."""
    short_names: tuple[str, ...]
    namespaced: bool
    object_type: type[diagnosis.DiagnosisObject]

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def group(self) -> str:
        return diagnosis.GROUP

    @property
    def version(self) -> str:
        return diagnosis.VERSION

    @property
    def api_version(self) -> str:
        return diagnosis.API_VERSION

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"


DIAGNOSIS_CATEGORY: Final = "kubediag"

OPERATION: Final = DiagnosisKind(
    kind="Operation", plural="operations", short_names=("op",), namespaced=False, object_type=diagnosis.Operation
)
OPERATION_SET: Final = DiagnosisKind(
    kind="OperationSet",
    plural="operationsets",
    short_names=("opset",),
    namespaced=False,
    object_type=diagnosis.OperationSet,
)
DIAGNOSIS: Final = DiagnosisKind(
    kind="Diagnosis", plural="diagnoses", short_names=("diag",), namespaced=True, object_type=diagnosis.Diagnosis
)
DIAGNOSIS_TASK: Final = DiagnosisKind(
    kind="Task", plural="tasks", short_names=("diagtask",), namespaced=True, object_type=diagnosis.Task
)

DIAGNOSIS_KINDS: Final = (OPERATION, OPERATION_SET, DIAGNOSIS, DIAGNOSIS_TASK)
