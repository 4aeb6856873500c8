"""Admission rules for KubeDiag's kinds: validation and defaulting of the raw JSON object.

The same approach and error format as the node jobs' rules (:mod:`schemas.validation`): the rules
read the object as the API server sends it, so a field of the wrong type becomes a
:class:`~schemas.checker.FieldError` naming its path, and an object that passes them is also
converted to its msgspec type. Every rejection names the field. The rules of each kind are
:mod:`schemas.diagnosis.operation_rules` (Operation, OperationSet) and
:mod:`schemas.diagnosis.diagnosis_rules` (Diagnosis, Task); this module tells the kinds apart, checks
an UPDATE and sets the defaults.

Beyond KubeDiag's webhooks (exactly one processor, http or https, port range, timeout above 0,
two graph nodes at least, no operation on node 0, a Diagnosis names its OperationSet): the graph is
checked whole (:mod:`schemas.diagnosis.graph`) instead of by a builder retrying forever, a Diagnosis
needs exactly one kind of target, a ``function`` processor is refused saying why, an HTTP processor
names its port (nodetaskd's agent serves no processors of its own), a builtin processor must exist,
parameters may not shadow the keys every Task gets, and the spec of a Diagnosis or Task is immutable
(a run resumes from its checkpoint over the same OperationSet and targets).

What one Diagnosis may ask of the cluster is bounded, since whoever may create one in a namespace
chooses it: its parameters take at most :data:`~schemas.diagnosis.v1.MAX_PARAMETERS_BYTES` as JSON,
it lists at most ``max_targets`` node names or pod references (the controller's
``diagnosisMaxTargets``; a selector's nodes are counted by the controller), and its pod references
name pods of its own namespace only, as its pod selector selects there: a Diagnosis must not learn
whether a pod of another namespace exists, nor its node. The controller applies the same rules to
a Diagnosis stored while the webhook was away.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from schemas.checker import Checker, FieldError, PatchOperation, json_type, type_errors, without_nulls
from schemas.diagnosis import graph as diagnosis_graph
from schemas.diagnosis.diagnosis_rules import check_diagnosis, check_task
from schemas.diagnosis.kinds import DIAGNOSIS, DIAGNOSIS_TASK, OPERATION, OPERATION_SET, DiagnosisKind
from schemas.diagnosis.manifest import diagnosis_kind_of
from schemas.diagnosis.operation_rules import check_operation, check_operation_set
from schemas.diagnosis.v1 import DEFAULT_MAX_TARGETS, StagePolicy
from schemas.manifest import ManifestError
from schemas.processors import DEFAULT_TIMEOUT_SECONDS

__all__ = ["default_patch", "validate_create", "validate_update"]

_CHECKS: Final = {
    OPERATION.kind: check_operation,
    OPERATION_SET.kind: check_operation_set,
    DIAGNOSIS_TASK.kind: check_task,
}
"""The checks of each kind but Diagnosis, whose rules also read its namespace and the target limit."""
_KINDS: Final = frozenset((*_CHECKS, DIAGNOSIS.kind))


def _identify(c: Checker, obj: Mapping[str, Any]) -> DiagnosisKind | None:
    api_version = c.typed(obj, "apiVersion", "", str, "a string")
    kind = c.typed(obj, "kind", "", str, "a string")
    if api_version is None or kind is None:
        for key in ("apiVersion", "kind"):
            if obj.get(key) is None:
                c.fail(key, "is required")
        return None
    try:
        return diagnosis_kind_of(api_version, kind)
    except ManifestError as exc:
        c.fail("apiVersion" if kind in _KINDS else "kind", str(exc))
        return None


def validate_create(
    obj: object, *, namespace: str = "", max_targets: int = DEFAULT_MAX_TARGETS
) -> tuple[FieldError, ...]:
    """The broken rules of an Operation, OperationSet, Diagnosis or Task; empty when it is valid.

    ``namespace``: the request's, for an object whose metadata does not name one yet; ``max_targets``:
    how many node names or pod references a Diagnosis may list. At most
    :data:`~schemas.checker.MAX_ERRORS`, then :data:`~schemas.checker.STOPPED` if there were
    more. Never raises: any JSON value is a valid input, and garbage yields errors naming its fields.
    """
    return Checker().run(_check_object, obj, namespace, max_targets)


def _check_object(c: Checker, obj: object, namespace: str, max_targets: int) -> None:
    if not isinstance(obj, dict):
        c.fail("(object)", f"must be an object, got {json_type(obj)}")
        return
    kind = _identify(c, obj)
    if kind is None:
        return
    spec = c.typed(obj, "spec", "", dict, "an object")
    if spec is None:
        if obj.get("spec") is None:
            c.fail("spec", "is required")
        return
    if kind.kind == DIAGNOSIS.kind:
        metadata = obj.get("metadata")
        own = metadata.get("namespace") if isinstance(metadata, dict) else None
        check_diagnosis(c, spec, namespace=own if isinstance(own, str) and own else namespace, max_targets=max_targets)
    else:
        _CHECKS[kind.kind](c, spec)
    if not c.errors:
        c.errors.extend(type_errors(without_nulls(obj), kind.object_type))


def validate_update(
    new: object, old: object, *, namespace: str = "", max_targets: int = DEFAULT_MAX_TARGETS
) -> tuple[FieldError, ...]:
    """The spec of a Diagnosis or Task is immutable; an Operation or OperationSet may change.

    A changed OperationSet fails the Diagnoses running it (OperationSetChanged). An unchanged spec is
    not re-validated, so objects admitted under older rules can still be updated (finalizers, status).
    """
    if not isinstance(new, dict) or not isinstance(old, dict):
        return validate_create(new, namespace=namespace, max_targets=max_targets)
    if _defaulted_spec(new) == _defaulted_spec(old):
        return ()
    if new.get("kind") in (DIAGNOSIS.kind, DIAGNOSIS_TASK.kind) and new.get("kind") == old.get("kind"):
        return (
            FieldError(
                path="spec",
                message=f"a {new['kind']}'s spec is immutable: a run resumes from its checkpoint over the same "
                "OperationSet, targets and parameters",
            ),
        )
    return validate_create(new, namespace=namespace, max_targets=max_targets)


def _defaulted_spec(obj: Mapping[str, Any]) -> object:
    """The spec as it is once defaulted: a Diagnosis stored while the mutating webhook was away (its
    failure policy is Ignore) gets ``stagePolicy`` on its next update, which changes nothing."""
    spec = without_nulls(obj.get("spec"))
    if obj.get("kind") == DIAGNOSIS.kind and isinstance(spec, dict):
        return {"stagePolicy": StagePolicy.ALL.value, **spec}
    return spec


def default_patch(obj: object) -> tuple[PatchOperation, ...]:
    """JSON Patch operations that set KubeDiag's defaults where they are absent.

    Operation: ``processor.timeoutSeconds`` 30, and an httpServer's ``scheme`` http and ``path`` /.
    OperationSet: each node's ``id``, its list position. Diagnosis: ``stagePolicy`` All. Only absent
    or null fields are set; objects too malformed to locate them get no patch (validation reports them).
    """
    if not isinstance(obj, dict) or not isinstance(spec := obj.get("spec"), dict):
        return ()
    ops: list[PatchOperation] = []
    match obj.get("kind"):
        case OPERATION.kind if isinstance(processor := spec.get("processor"), dict):
            if processor.get("timeoutSeconds") is None:
                ops.append(_add("/spec/processor/timeoutSeconds", DEFAULT_TIMEOUT_SECONDS))
            if isinstance(server := processor.get("httpServer"), dict):
                for key, value in (("scheme", "http"), ("path", "/")):
                    if server.get(key) is None:
                        ops.append(_add(f"/spec/processor/httpServer/{key}", value))
        # A longer graph is refused by validation: a patch per node would only grow the answer.
        case OPERATION_SET.kind if (
            isinstance(nodes := spec.get("adjacencyList"), list) and len(nodes) <= diagnosis_graph.MAX_NODES
        ):
            ops.extend(
                _add(f"/spec/adjacencyList/{i}/id", i)
                for i, node in enumerate(nodes)
                if isinstance(node, dict) and node.get("id") is None
            )
        case DIAGNOSIS.kind if spec.get("stagePolicy") is None:
            ops.append(_add("/spec/stagePolicy", StagePolicy.ALL.value))
        case _:
            pass
    return tuple(ops)


def _add(path: str, value: object) -> PatchOperation:
    return PatchOperation(op="add", path=path, value=value)
