"""Admission rules of a Diagnosis (its OperationSet, parameters and targets) and a Task (its node and pod).

What one Diagnosis may ask of the cluster is bounded here (see :mod:`schemas.diagnosis.validation`):
its parameters' size, how many targets it lists, and pod references of its own namespace only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from nodetask.names import is_object_name
from schemas.checker import INT32_MAX, Checker, json_type
from schemas.diagnosis.v1 import MAX_PARAMETERS_BYTES, TELEMETRY_KEYS, StagePolicy, parameters_bytes

__all__ = ["check_diagnosis", "check_task"]

_TARGETS: Final = (
    ("targetNodeSelector", "nodeSelector", dict, "a label selector object"),
    ("targetNodeNames", "nodeNames", list, "an array of node names"),
    ("targetPodSelector", "podSelector", dict, "a label selector object"),
    ("targetPodNames", "podReferences", list, "an array of pod references"),
)
_ONE_TARGET: Final = "set exactly one of nodeSelector, nodeNames, podSelector, podReferences"
_WHERE_POD_RUNS: Final = "the Task runs where the referenced pod runs, so a node name beside it could only disagree"


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


def _check_single_targets(c: Checker, spec: Mapping[str, Any], *, namespace: str) -> list[str]:
    """KubeDiag v1's ``spec.nodeName`` and ``spec.podReference`` (its samples' spelling); the ones set."""
    chosen = []
    node = c.typed(spec, "nodeName", "spec", str, "a string")
    if node:
        chosen.append("nodeName")
    reference = spec.get("podReference")
    if reference is not None:
        _check_pod_reference(c, reference, "spec.podReference", namespace=namespace)
        chosen.append("podReference")
    return chosen


def _check_single_target_only(c: Checker, chosen: list[str]) -> None:
    """Without a targetSelector: exactly one of KubeDiag v1's single-target fields."""
    if not chosen:
        single = "KubeDiag v1's spec.nodeName or spec.podReference"
        c.fail("spec.targetSelector", f"is required: {_ONE_TARGET} (or {single})")
    elif len(chosen) > 1:
        c.fail("spec", f"must set one of spec.nodeName and spec.podReference, got both: {_WHERE_POD_RUNS}")


def _check_targets(c: Checker, spec: Mapping[str, Any], *, namespace: str, max_targets: int) -> None:
    path = "spec.targetSelector"
    before = len(c.errors)
    chosen = [f"spec.{key}" for key in _check_single_targets(c, spec, namespace=namespace)]
    selector = c.typed(spec, "targetSelector", "spec", dict, "an object")
    if selector is None:
        if len(c.errors) == before:
            _check_single_target_only(c, chosen)
        return
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


def check_diagnosis(c: Checker, spec: Mapping[str, Any], *, namespace: str, max_targets: int) -> None:
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
    _check_targets(c, spec, namespace=namespace, max_targets=max_targets)
    policy = c.typed(spec, "stagePolicy", "spec", str, "a string")
    if policy is not None and policy not in tuple(StagePolicy):
        c.fail(
            "spec.stagePolicy",
            f"must be All (a stage passes when all its Tasks succeeded) or Any (when one did), got {policy!r}",
        )
    c.check_range(spec, "ttlSecondsAfterFinished", "spec", 0, INT32_MAX)


def check_task(c: Checker, spec: Mapping[str, Any]) -> None:
    _check_name(c, spec, "operation", "spec", "Operation")
    node = c.typed(spec, "nodeName", "spec", str, "a string")
    if spec.get("nodeName") is None or node == "":
        c.fail("spec.nodeName", "is required: the node the Task runs on (a podReference only adds the pod's keys)")
    if spec.get("podReference") is not None:
        _check_pod_reference(c, spec["podReference"], "spec.podReference")
    _check_strings(c, spec, "parameters", "spec")
