"""Admission rules for KubeDiag's kinds: validation and defaulting of the raw JSON object.

The same approach and error format as the node jobs' rules (:mod:`schemas.validation`): the rules
read the object as the API server sends it, so a field of the wrong type becomes a
:class:`~schemas.checker.FieldError` naming its path, and an object that passes them is also
converted to its msgspec type. Every rejection names the field.

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

import ipaddress
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from nodetask.names import is_object_name
from schemas.checker import MSGSPEC_PATH, Checker, FieldError, PatchOperation, json_type, without_nulls
from schemas.diagnosis import graph as diagnosis_graph
from schemas.diagnosis.kinds import DIAGNOSIS, DIAGNOSIS_TASK, OPERATION, OPERATION_SET, DiagnosisKind
from schemas.diagnosis.manifest import diagnosis_kind_of
from schemas.diagnosis.v1 import (
    DEFAULT_MAX_TARGETS,
    MAX_PARAMETERS_BYTES,
    TELEMETRY_KEYS,
    AdjacencyNode,
    StagePolicy,
    parameters_bytes,
)
from schemas.manifest import ManifestError
from schemas.processors import BUILTIN_PROCESSORS, DEFAULT_TIMEOUT_SECONDS

__all__ = ["default_patch", "validate_create", "validate_update"]

_PROCESSORS: Final = ("httpServer", "scriptRunner", "builtin")
_ONE_PROCESSOR: Final = "must set exactly one of httpServer, scriptRunner, builtin"
_FUNCTION_REFUSED: Final = (
    "the function processor (an image built with Docker on each node) is not supported by nodetaskd; "
    "use httpServer, scriptRunner or builtin"
)
_TARGETS: Final = (
    ("targetNodeSelector", "nodeSelector", dict, "a label selector object"),
    ("targetNodeNames", "nodeNames", list, "an array of node names"),
    ("targetPodSelector", "podSelector", dict, "a label selector object"),
    ("targetPodNames", "podReferences", list, "an array of pod references"),
)
_ONE_TARGET: Final = "set exactly one of nodeSelector, nodeNames, podSelector, podReferences"
_INT32_MAX: Final = 2**31 - 1


def _check_name(c: Checker, obj: Mapping[str, Any], key: str, path: str, what: str) -> None:
    """A required reference to another object by name."""
    name = c.typed(obj, key, path, str, "a string")
    if obj.get(key) is None or name == "":
        c.fail(f"{path}.{key}", f"is required: the name of the {what}")
    elif name is not None and not is_object_name(name):
        c.fail(f"{path}.{key}", f"must be the name of an {what} (a lowercase DNS subdomain), got {name!r}")


def _check_strings(c: Checker, obj: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
    """An object of strings such as ``parameters``; returns it (empty when absent or wrong)."""
    values = c.typed(obj, key, path, dict, "an object of strings")
    for name, value in (values or {}).items():
        if not name:
            c.fail(f"{path}.{key}", "keys must not be empty")
        if not isinstance(value, str):
            c.fail(f"{path}.{key}[{name!r}]", f"must be a string, got {json_type(value)}")
    return values or {}


def _check_http(c: Checker, server: Mapping[str, Any], path: str) -> None:
    address = c.typed(server, "address", path, str, "a string")
    if address is not None and not _is_host(address):
        c.fail(f"{path}.address", f"must be an IP address or a DNS name, got {address!r}")
    if server.get("port") is None:
        c.fail(
            f"{path}.port",
            "is required: nodetaskd's agent serves no processors of its own "
            "(what KubeDiag's agent serves on its port are builtin processors here)",
        )
    c.check_range(server, "port", path, 1, 65535)
    url_path = c.typed(server, "path", path, str, "a string")
    if url_path is not None and not url_path.startswith("/"):
        c.fail(f"{path}.path", f"must start with /, got {url_path!r}")
    scheme = c.typed(server, "scheme", path, str, "a string")
    if scheme is not None and scheme not in ("http", "https"):
        c.fail(f"{path}.scheme", f"must be http or https, got {scheme!r}")


def _is_host(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return is_object_name(value)
    return True


def _check_script(c: Checker, runner: Mapping[str, Any], path: str) -> None:
    script = c.typed(runner, "script", path, str, "a string")
    if runner.get("script") is None or script == "":
        c.fail(f"{path}.script", "is required: the script's text")
    keys = c.typed(runner, "argKeys", path, list, "an array of request keys")
    for i, key in enumerate(keys or ()):
        if not isinstance(key, str) or not key:
            c.fail(f"{path}.argKeys[{i}]", f"must be a non-empty request key, got {key!r}")
    result_key = c.typed(runner, "operationResultKey", path, str, "a string")
    if result_key == "":
        c.fail(f"{path}.operationResultKey", "must not be empty when set")


def _check_builtin(c: Checker, builtin: Mapping[str, Any], path: str) -> None:
    name = c.typed(builtin, "name", path, str, "a string")
    if builtin.get("name") is None:
        c.fail(f"{path}.name", f"is required: one of {', '.join(BUILTIN_PROCESSORS)}")
    elif name is not None and name not in BUILTIN_PROCESSORS:
        c.fail(f"{path}.name", f"must be one of {', '.join(BUILTIN_PROCESSORS)}, got {name!r}")


def _check_operation(c: Checker, spec: Mapping[str, Any]) -> None:
    path = "spec.processor"
    processor = c.typed(spec, "processor", "spec", dict, "an object")
    if processor is None:
        if spec.get("processor") is None:
            c.fail(path, f"is required and {_ONE_PROCESSOR}")
        return
    if processor.get("function") is not None:
        c.fail(f"{path}.function", _FUNCTION_REFUSED)
    present = [key for key in _PROCESSORS if processor.get(key) is not None]
    if len(present) > 1:
        c.fail(path, f"{_ONE_PROCESSOR}, got {', '.join(present)}")
    elif not present and processor.get("function") is None:
        c.fail(path, f"{_ONE_PROCESSOR}, got none")
    checks = (("httpServer", _check_http), ("scriptRunner", _check_script), ("builtin", _check_builtin))
    for key, check in checks:
        value = c.typed(processor, key, path, dict, "an object")
        if value is not None:
            check(c, value, f"{path}.{key}")
    c.check_range(processor, "timeoutSeconds", path, 1, _INT32_MAX)


def _check_operation_set(c: Checker, spec: Mapping[str, Any]) -> None:
    path = "spec.adjacencyList"
    nodes = c.typed(spec, "adjacencyList", "spec", list, "an array of graph nodes")
    if nodes is None:
        if spec.get("adjacencyList") is None:
            c.fail(path, "is required: the graph, node 0 first (the start, without an operation)")
        return
    if len(nodes) > diagnosis_graph.MAX_NODES:
        # Said before any node is read: the graph is refused whatever its nodes hold.
        c.fail(path, f"has {len(nodes)} nodes; at most {diagnosis_graph.MAX_NODES} are allowed")
        return
    before = len(c.errors)
    for i, node in enumerate(nodes):
        at = f"{path}[{i}]"
        if not isinstance(node, dict):
            c.fail(at, f"must be an object, got {json_type(node)}")
            continue
        c.typed(node, "id", at, int, "an integer")
        operation = c.typed(node, "operation", at, str, "a string")
        if operation and not is_object_name(operation):
            message = f"must be the name of an Operation (a lowercase DNS subdomain), got {operation!r}"
            c.fail(f"{at}.operation", message)
        for key in ("to", "dependences"):
            for k, target in enumerate(c.typed(node, key, at, list, "an array of node ids") or ()):
                if not isinstance(target, int) or isinstance(target, bool):
                    c.fail(f"{at}.{key}[{k}]", f"must be a node id (an integer), got {json_type(target)}")
    if len(c.errors) > before:
        return  # the graph cannot be read until its fields have the right types
    graph = msgspec.convert(without_nulls(nodes), type=tuple[AdjacencyNode, ...])
    for problem in diagnosis_graph.problems(graph):
        c.fail(problem.path(path), problem.message)


def _check_pod_reference(c: Checker, ref: object, path: str, *, namespace: str | None = None) -> None:
    """A pod reference; with ``namespace`` (a Diagnosis's), one to a pod of that namespace only."""
    if not isinstance(ref, dict):
        c.fail(path, f"must be an object with namespace and name, got {json_type(ref)}")
        return
    for key in ("namespace", "name"):
        value = c.typed(ref, key, path, str, "a string")
        if ref.get(key) is None or value == "":
            c.fail(f"{path}.{key}", "is required")
    c.typed(ref, "container", path, str, "a string")
    pod_namespace = ref.get("namespace")
    if namespace is not None and isinstance(pod_namespace, str) and pod_namespace and pod_namespace != namespace:
        c.fail(
            f"{path}.namespace",
            f"must be the Diagnosis's own namespace {namespace!r}, got {pod_namespace!r}:"
            " a Diagnosis targets pods of its namespace only",
        )


def _check_listed(c: Checker, items: list[Any], path: str, *, pods: bool, namespace: str) -> None:
    """Listed targets: pod references (of ``namespace`` only), or node names."""
    for i, item in enumerate(items):
        if pods:
            _check_pod_reference(c, item, f"{path}[{i}]", namespace=namespace)
        elif not isinstance(item, str) or not item:
            c.fail(f"{path}[{i}]", f"must be a non-empty node name, got {item!r}")


def _check_targets(c: Checker, spec: Mapping[str, Any], *, namespace: str, max_targets: int) -> None:
    path = "spec.targetSelector"
    selector = c.typed(spec, "targetSelector", "spec", dict, "an object")
    if selector is None:
        if spec.get("targetSelector") is None:
            c.fail(path, f"is required: {_ONE_TARGET}")
        return
    before = len(c.errors)
    chosen: list[str] = []
    for design_key, head_key, expected, name in _TARGETS:
        spelled = []
        for key in (design_key, head_key):
            value = c.typed(selector, key, path, expected, name)
            # An empty list means "not specified", as for the node jobs' nodeNames; an empty
            # selector object selects everything, as in Kubernetes.
            if value is None or value == []:
                continue
            spelled.append(key)
            if isinstance(value, list):
                _check_listed(c, value, f"{path}.{key}", pods=design_key == "targetPodNames", namespace=namespace)
                if len(value) > max_targets:
                    c.fail(f"{path}.{key}", f"lists {len(value)} targets; a Diagnosis may have at most {max_targets}")
        if len(spelled) == 2:
            c.fail(f"{path}.{design_key}", f"and {head_key} are two spellings of one target; set only one")
        chosen.extend(spelled[:1])
    if len(c.errors) > before:
        return
    if not chosen:
        c.fail(path, f"must {_ONE_TARGET} (or targetNodeSelector, targetNodeNames, targetPodSelector, targetPodNames)")
    elif len(chosen) > 1:
        c.fail(path, f"must {_ONE_TARGET}, got {', '.join(chosen)}")


def _check_diagnosis(c: Checker, spec: Mapping[str, Any], *, namespace: str, max_targets: int) -> None:
    _check_name(c, spec, "operationSet", "spec", "OperationSet")
    parameters = _check_strings(c, spec, "parameters", "spec")
    size = parameters_bytes(parameters)
    if size > MAX_PARAMETERS_BYTES:
        c.fail("spec.parameters", f"take {size} bytes as JSON; a Diagnosis's may take at most {MAX_PARAMETERS_BYTES}")
    for key in parameters:
        if key in TELEMETRY_KEYS:
            c.fail(
                f"spec.parameters[{key!r}]",
                f"is set by nodetaskd for every Task ({', '.join(TELEMETRY_KEYS)}); choose another key",
            )
    for removed, instead in (("nodeName", "nodeNames"), ("podReference", "podReferences")):
        if spec.get(removed) is not None:
            c.fail(f"spec.{removed}", f"is KubeDiag's removed single-target field; use spec.targetSelector.{instead}")
    _check_targets(c, spec, namespace=namespace, max_targets=max_targets)
    policy = c.typed(spec, "stagePolicy", "spec", str, "a string")
    if policy is not None and policy not in tuple(StagePolicy):
        c.fail(
            "spec.stagePolicy",
            f"must be All (a stage passes when all its Tasks succeeded) or Any (when one did), got {policy!r}",
        )
    c.check_range(spec, "ttlSecondsAfterFinished", "spec", 0, _INT32_MAX)


def _check_task(c: Checker, spec: Mapping[str, Any]) -> None:
    _check_name(c, spec, "operation", "spec", "Operation")
    node = c.typed(spec, "nodeName", "spec", str, "a string")
    if spec.get("nodeName") is None or node == "":
        c.fail("spec.nodeName", "is required: the node the Task runs on (a podReference only adds the pod's keys)")
    if spec.get("podReference") is not None:
        _check_pod_reference(c, spec["podReference"], "spec.podReference")
    _check_strings(c, spec, "parameters", "spec")


_CHECKS: Final = {
    OPERATION.kind: _check_operation,
    OPERATION_SET.kind: _check_operation_set,
    DIAGNOSIS_TASK.kind: _check_task,
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


def _type_errors(obj: Mapping[str, Any], kind: DiagnosisKind) -> list[FieldError]:
    """Whatever the rules did not cover, as msgspec reports it when converting to the API type."""
    try:
        msgspec.convert(without_nulls(obj), type=kind.object_type)
    except msgspec.ValidationError as exc:
        match = MSGSPEC_PATH.fullmatch(str(exc))
        if match is None:
            return [FieldError(path="(object)", message=str(exc))]
        return [FieldError(path=match["path"] or "(object)", message=match["message"])]
    return []


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
        _check_diagnosis(c, spec, namespace=own if isinstance(own, str) and own else namespace, max_targets=max_targets)
    else:
        _CHECKS[kind.kind](c, spec)
    if not c.errors:
        c.errors.extend(_type_errors(obj, kind))


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
