"""Kubernetes object plumbing shared by every node-job kind.

Only the parts of ``metav1`` that nodetaskd reads are typed here; the rest of an object's metadata
(``managedFields`` and friends) is ignored on decoding.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Final

import msgspec

from nodetask.label_requirements import Operator, Requirement, format_label_selector, requirement_matches
from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase

__all__ = [
    "ApiStruct",
    "ConditionStatus",
    "Int32",
    "JobPhase",
    "LabelSelector",
    "LabelSelectorRequirement",
    "NodeTaskPhase",
    "ObjectMeta",
    "OwnerReference",
    "Tolerance",
    "UInt32",
    "parse_tolerance",
]

Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1, extra_json_schema={"format": "int32"})]
"""A Go ``int32``: KubeEdge's CRDs declare these as ``integer`` with ``format: int32``."""

UInt32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1, extra_json_schema={"format": "int32"})]
"""A Go ``*uint32`` (``timeoutSeconds``): never negative, still ``format: int32`` in the CRD."""


_DECIMAL: Final = r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_TOLERANCE: Final = re.compile(_DECIMAL)

Tolerance = Annotated[str, msgspec.Meta(pattern=_DECIMAL)]
"""``failureTolerate``: a decimal as written in ASCII, nothing around it. Python's Decimal() alone would
also take surrounding whitespace, underscores and any script's digits (" 0.5", "0.5\\n", "０.5"). The
pattern is also the CRD's, so the API server refuses such strings too; :func:`parse_tolerance` reads it."""


def parse_tolerance(text: str | None) -> Decimal | None:
    """The ``failureTolerate`` string as a decimal within [0, 1]; None when absent.

    Errors: ValueError naming the value for anything else (whitespace, non-ASCII digits, NaN,
    infinities, out of range): KubeEdge would silently use 0 instead.
    """
    if text is None:
        return None
    # fullmatch: the pattern's $ would also accept a final newline in Python (not in Go).
    value = Decimal(text) if _TOLERANCE.fullmatch(text) else None
    if value is None or not 0 <= value <= 1:
        raise ValueError(f"failureTolerate must be a number within [0, 1], got {text!r}")
    return value


class ApiStruct(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Base of the API types.

    ``rename="camel"`` gives Kubernetes' JSON keys from snake_case attributes and ``omit_defaults``
    mirrors Go's ``omitempty``. Unknown keys are ignored, not rejected: the API server prunes them
    from custom resources anyway, and KubeEdge's own samples carry fields its types no longer have
    (``allowDowngrade``, ``strategy``). Wrong *types* are still errors that name the field path.
    """


class OwnerReference(ApiStruct, frozen=True):
    """``metav1.OwnerReference``: the object this one belongs to (a Task's Diagnosis)."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(ApiStruct, frozen=True):
    """The ``metadata`` fields nodetaskd uses."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: str = ""
    deletion_timestamp: str | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    finalizers: tuple[str, ...] = ()
    owner_references: tuple[OwnerReference, ...] = ()


class LabelSelectorRequirement(ApiStruct, frozen=True):
    """One ``matchExpressions`` entry of a ``metav1.LabelSelector``."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


_EXPRESSION_OPERATORS: Final = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
}


class LabelSelector(ApiStruct, frozen=True):
    """``metav1.LabelSelector``."""

    match_labels: dict[str, str] = {}
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()

    def __post_init__(self) -> None:
        for req in self.match_expressions:
            if req.operator not in _EXPRESSION_OPERATORS:
                raise ValueError(
                    f"matchExpressions operator {req.operator!r} is not one of In, NotIn, Exists, DoesNotExist"
                )
            if req.operator in ("In", "NotIn") and not req.values:
                raise ValueError(f"matchExpressions operator {req.operator} needs values (key {req.key!r})")
            if req.operator in ("Exists", "DoesNotExist") and req.values:
                raise ValueError(f"matchExpressions operator {req.operator} takes no values (key {req.key!r})")

    def requirements(self) -> tuple[Requirement, ...]:
        """The selector as label-selector requirements (``metav1.LabelSelectorAsSelector``), unchecked."""
        reqs = [Requirement(key=k, op=Operator.EQUALS, values=(v,)) for k, v in sorted(self.match_labels.items())]
        reqs += [
            Requirement(key=req.key, op=_EXPRESSION_OPERATORS[req.operator], values=tuple(sorted(set(req.values))))
            for req in self.match_expressions
        ]
        return tuple(reqs)

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether a label set is selected, with the API server's semantics."""
        for key, value in self.match_labels.items():
            if not requirement_matches(key, Operator.EQUALS, (value,), labels):
                return False
        for req in self.match_expressions:
            if not requirement_matches(req.key, _EXPRESSION_OPERATORS[req.operator], req.values, labels):
                return False
        return True

    def to_query(self) -> str:
        """The ``labelSelector`` query-string form the API server accepts."""
        return format_label_selector(self.requirements())
