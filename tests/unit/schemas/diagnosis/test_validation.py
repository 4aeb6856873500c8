"""Admission rules of the diagnosis kinds: every rejection names its field; defaults are KubeDiag's."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.checker import MAX_ERRORS, STOPPED, PatchOperation
from schemas.diagnosis.graph import MAX_NODES
from schemas.diagnosis.manifest import decode_diagnosis_object
from schemas.diagnosis.v1 import (
    DEFAULT_MAX_TARGETS,
    MAX_PARAMETERS_BYTES,
    Diagnosis,
    Operation,
    OperationSet,
    PodReference,
    StagePolicy,
    TargetSelector,
)
from schemas.diagnosis.validation import default_patch, validate_create, validate_update
from tests import kubediag_samples as samples

V1 = "diagnosis.kubediag.org/v1"


def operation(**processor: Any) -> dict[str, Any]:
    base = {"httpServer": {"address": "127.0.0.1", "port": 8080, "path": "/collect", "scheme": "http"}}
    return {"apiVersion": V1, "kind": "Operation", "metadata": {"name": "o"}, "spec": {"processor": base | processor}}


def script(**runner: Any) -> dict[str, Any]:
    base = {"script": "#!/bin/sh\necho ok\n", "argKeys": ["path"]}
    return {
        "apiVersion": V1,
        "kind": "Operation",
        "metadata": {"name": "s"},
        "spec": {"processor": {"scriptRunner": base | runner}},
    }


def operation_set(*nodes: Any) -> dict[str, Any]:
    listed = list(nodes) or [{"id": 0, "to": [1]}, {"id": 1, "operation": "collect"}]
    return {"apiVersion": V1, "kind": "OperationSet", "metadata": {"name": "g"}, "spec": {"adjacencyList": listed}}


def diagnosis(targets: Any = None, **spec: Any) -> dict[str, Any]:
    base = {"operationSet": "g", "targetSelector": {"nodeNames": ["edge-1"]} if targets is None else targets}
    return {"apiVersion": V1, "kind": "Diagnosis", "metadata": {"name": "d", "namespace": "n"}, "spec": base | spec}


def untargeted(**spec: Any) -> dict[str, Any]:
    """A Diagnosis without a targetSelector (KubeDiag v1's single-target fields may be in ``spec``)."""
    obj = diagnosis(**spec)
    del obj["spec"]["targetSelector"]
    return obj


def task(**spec: Any) -> dict[str, Any]:
    base = {"operation": "collect", "nodeName": "edge-1", "parameters": {"a": "b"}}
    return {"apiVersion": V1, "kind": "Task", "metadata": {"name": "t", "namespace": "n"}, "spec": base | spec}


@pytest.mark.parametrize(
    "obj",
    [
        operation(),
        operation(httpServer={"port": 80}),
        operation(httpServer={"address": "::1", "port": 443, "scheme": "https"}, timeoutSeconds=5),
        operation(httpServer={"address": "probe.example.org", "port": 80}),
        operation(httpServer=None, builtin={"name": "network.probe"}),
        script(),
        script(operationResultKey="disk"),
        operation_set(),
        operation_set({"to": [1, 2]}, {"operation": "a", "to": [2]}, {"operation": "b"}),
        diagnosis(),
        diagnosis({"targetNodeNames": ["edge-1"]}, parameters={"a": "b"}, stagePolicy="Any"),
        diagnosis({"nodeSelector": {}}, ttlSecondsAfterFinished=0),
        diagnosis({"targetPodSelector": {"matchLabels": {"app": "web"}}}),
        diagnosis({"podReferences": [{"namespace": "n", "name": "web-0", "container": "c"}]}),
        diagnosis({"nodeNames": [], "podSelector": {"matchLabels": {"a": "b"}}}),
        task(),
        task(podReference={"namespace": "n", "name": "web-0"}),
    ],
    ids=lambda o: f"{o['kind']}",
)
def test_valid_objects_pass(obj: dict[str, Any]) -> None:
    """Valid objects of every kind, in either target spelling, have no error."""
    assert validate_create(obj) == ()


def _function_operation() -> dict[str, Any]:
    obj = operation(httpServer=None, function={"runtime": "python3", "codeSource": {"handler.py": "x"}})
    return obj


@pytest.mark.parametrize(
    ("obj", "path", "message"),
    [
        # Operation
        ({"apiVersion": V1, "kind": "Operation", "spec": {}}, "spec.processor", "is required and must set exactly one"),
        (_function_operation(), "spec.processor.function", "function processor (an image built with Docker"),
        (operation(builtin={"name": "agent.status"}), "spec.processor", "got httpServer, builtin"),
        (
            operation(httpServer=None),
            "spec.processor",
            "must set exactly one of httpServer, scriptRunner, builtin, got none",
        ),
        (
            operation(httpServer={"address": "127.0.0.1"}),
            "spec.processor.httpServer.port",
            "is required: nodetaskd's agent serves no processors",
        ),
        (operation(httpServer={"port": 0}), "spec.processor.httpServer.port", "must be within [1, 65535]"),
        (operation(httpServer={"port": "80"}), "spec.processor.httpServer.port", "must be an integer, got string"),
        (
            operation(httpServer={"port": 80, "scheme": "ftp"}),
            "spec.processor.httpServer.scheme",
            "must be http or https, got 'ftp'",
        ),
        (operation(httpServer={"port": 80, "path": "collect"}), "spec.processor.httpServer.path", "must start with /"),
        (
            operation(httpServer={"port": 80, "address": "no such host!"}),
            "spec.processor.httpServer.address",
            "an IP address or a DNS name",
        ),
        (operation(timeoutSeconds=0), "spec.processor.timeoutSeconds", "must be within [1, 2147483647]"),
        (script(script=""), "spec.processor.scriptRunner.script", "is required"),
        (script(argKeys=["a", ""]), "spec.processor.scriptRunner.argKeys[1]", "must be a non-empty request key"),
        (script(operationResultKey=""), "spec.processor.scriptRunner.operationResultKey", "must not be empty"),
        (
            operation(httpServer=None, builtin={"name": "shell"}),
            "spec.processor.builtin.name",
            "must be one of node.resources",
        ),
        (operation(httpServer=None, builtin={}), "spec.processor.builtin.name", "is required"),
        # OperationSet
        ({"apiVersion": V1, "kind": "OperationSet", "spec": {}}, "spec.adjacencyList", "is required"),
        (operation_set({"to": [1]}), "spec.adjacencyList", "needs at least two nodes"),
        (operation_set({"to": [1]}, "x"), "spec.adjacencyList[1]", "must be an object, got string"),
        (operation_set({"to": ["1"]}, {"operation": "a"}), "spec.adjacencyList[0].to[0]", "must be a node id"),
        (
            operation_set({"to": [1]}, {"operation": "Bad_Name"}),
            "spec.adjacencyList[1].operation",
            "lowercase DNS subdomain",
        ),
        (
            operation_set({"to": [1]}, {"operation": "a"}, {"operation": "b"}),
            "spec.adjacencyList[2]",
            "node 2 (b) is not reachable",
        ),
        (
            operation_set({"to": [1]}, {"operation": "a", "to": [0]}),
            "spec.adjacencyList[1].to[0]",
            "leads back to the start node 0",
        ),
        (operation_set({"to": [1]}, {"id": 7, "operation": "a"}), "spec.adjacencyList[1].id", "ids are list positions"),
        # Diagnosis
        (diagnosis(operationSet=""), "spec.operationSet", "is required: the name of the OperationSet"),
        (diagnosis(operationSet="Graph One"), "spec.operationSet", "lowercase DNS subdomain"),
        (
            {"apiVersion": V1, "kind": "Diagnosis", "spec": {"operationSet": "g"}},
            "spec.targetSelector",
            "is required: set exactly one",
        ),
        (
            diagnosis({}),
            "spec.targetSelector",
            "must set exactly one of nodeSelector, nodeNames, podSelector, podReferences",
        ),
        (diagnosis({"nodeNames": []}), "spec.targetSelector", "must set exactly one"),
        (diagnosis({"nodeNames": ["a"], "podSelector": {}}), "spec.targetSelector", "got nodeNames, podSelector"),
        (
            diagnosis({"nodeNames": ["a"], "targetNodeNames": ["a"]}),
            "spec.targetSelector.targetNodeNames",
            "and nodeNames are two spellings",
        ),
        (diagnosis({"nodeNames": [""]}), "spec.targetSelector.nodeNames[0]", "must be a non-empty node name"),
        (
            diagnosis({"nodeNames": "edge-1"}),
            "spec.targetSelector.nodeNames",
            "must be an array of node names, got string",
        ),
        (
            diagnosis({"podReferences": [{"name": "web-0"}]}),
            "spec.targetSelector.podReferences[0].namespace",
            "is required",
        ),
        (
            diagnosis({"targetPodNames": ["web-0"]}),
            "spec.targetSelector.targetPodNames[0]",
            "must be an object with namespace and name",
        ),
        (
            diagnosis({"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}),
            "spec.targetSelector.nodeSelector",
            "matchExpressions operator 'Near' is not one of In, NotIn, Exists, DoesNotExist",
        ),
        (diagnosis(parameters={"node": "edge-9"}), "spec.parameters['node']", "is set by nodetaskd for every Task"),
        (diagnosis(parameters={"a": 1}), "spec.parameters['a']", "must be a string, got integer"),
        (
            diagnosis(stagePolicy="Most"),
            "spec.stagePolicy",
            "must be All (a stage passes when all its Tasks succeeded) or Any",
        ),
        (diagnosis(ttlSecondsAfterFinished=-1), "spec.ttlSecondsAfterFinished", "must be within [0, 2147483647]"),
        (
            diagnosis(nodeName="my-node"),
            "spec.targetSelector",
            "must set exactly one of nodeSelector, nodeNames, podSelector, podReferences, got spec.nodeName, nodeNames",
        ),
        (
            diagnosis(None, podReference={"namespace": "n", "name": "web-0"}),
            "spec.targetSelector",
            "got spec.podReference, nodeNames",
        ),
        (
            untargeted(nodeName="my-node", podReference={"namespace": "n", "name": "web-0"}),
            "spec",
            "must set one of spec.nodeName and spec.podReference, got both: the Task runs where the referenced pod",
        ),
        (
            untargeted(podReference={"namespace": "kube-system", "name": "etcd-0"}),
            "spec.podReference.namespace",
            "must be the Diagnosis's own namespace 'n', got 'kube-system'",
        ),
        (untargeted(podReference={"namespace": "n"}), "spec.podReference.name", "is required"),
        (untargeted(nodeName=["my-node"]), "spec.nodeName", "must be a string"),
        (diagnosis({}), "spec.targetSelector", "must set exactly one of nodeSelector"),
        (untargeted(), "spec.targetSelector", "or KubeDiag v1's spec.nodeName or spec.podReference"),
        # Task
        (task(operation=None), "spec.operation", "is required: the name of the Operation"),
        (task(nodeName=""), "spec.nodeName", "is required: the node the Task runs on"),
        (task(podReference={"namespace": "n"}), "spec.podReference.name", "is required"),
        # Any kind
        ([], "(object)", "must be an object, got array"),
        ({"kind": "Task", "spec": {}}, "apiVersion", "is required"),
        ({"apiVersion": "diagnosis.kubediag.org/v2", "kind": "Task"}, "apiVersion", "served at version 'v1' only"),
        ({"apiVersion": V1, "kind": "Abnormal"}, "kind", "not a diagnosis kind"),
        ({"apiVersion": V1, "kind": "Task", "spec": []}, "spec", "must be an object, got array"),
    ],
)
def test_rejections_name_the_field(obj: Any, path: str, message: str) -> None:
    """Each broken rule is reported at its field path with a message saying what is wrong."""
    errors = validate_create(obj)
    assert any(e.path == path and message in e.message for e in errors), errors


def test_a_diagnosis_has_at_most_64_kib_of_parameters() -> None:
    """Parameters of 64 KiB as JSON pass; one byte more is refused saying the size and the limit."""
    empty = len(msgspec.json.encode({"k": ""}))
    at_limit = diagnosis(parameters={"k": "x" * (MAX_PARAMETERS_BYTES - empty)})
    assert validate_create(at_limit) == ()
    over = diagnosis(parameters={"k": "x" * (MAX_PARAMETERS_BYTES - empty + 1)})
    [error] = validate_create(over)
    assert (error.path, error.message) == (
        "spec.parameters",
        f"take {MAX_PARAMETERS_BYTES + 1} bytes as JSON; a Diagnosis's may take at most {MAX_PARAMETERS_BYTES}",
    )


@pytest.mark.parametrize("key", ["nodeNames", "targetNodeNames", "podReferences", "targetPodNames"])
def test_a_diagnosis_lists_at_most_max_targets(key: str) -> None:
    """Up to ``max_targets`` node names or pod references pass, one more is refused naming the count; the
    default is the controller's default."""
    item: object = {"namespace": "n", "name": "p"} if "Pod" in key or "pod" in key else "edge"
    assert validate_create(diagnosis({key: [item] * 3}), max_targets=3) == ()
    [error] = validate_create(diagnosis({key: [item] * 4}), max_targets=3)
    assert (error.path, error.message) == (
        f"spec.targetSelector.{key}",
        "lists 4 targets; a Diagnosis may have at most 3",
    )
    assert validate_create(diagnosis({key: [item] * DEFAULT_MAX_TARGETS})) == ()
    assert validate_create(diagnosis({key: [item] * (DEFAULT_MAX_TARGETS + 1)})) != ()


def test_pod_references_name_pods_of_the_diagnosis_namespace_only() -> None:
    """A reference to a pod of another namespace is refused (its existence and node are not the Diagnosis's to
    learn); the namespace is the object's, or the request's when the object does not say yet."""
    other = diagnosis({"podReferences": [{"namespace": "n", "name": "a"}, {"namespace": "kube-system", "name": "b"}]})
    [error] = validate_create(other)
    assert (error.path, error.message) == (
        "spec.targetSelector.podReferences[1].namespace",
        "must be the Diagnosis's own namespace 'n', got 'kube-system': a Diagnosis targets pods of its namespace only",
    )
    unplaced = copy.deepcopy(other)
    del unplaced["metadata"]["namespace"]
    assert [e.path for e in validate_create(unplaced, namespace="n")] == [error.path]
    assert [e.path for e in validate_create(unplaced, namespace="kube-system")] == [
        "spec.targetSelector.podReferences[0].namespace"
    ]
    assert validate_create(diagnosis({"targetPodNames": [{"namespace": "n", "name": "a"}]})) == ()


def test_unreachable_and_unknown_nodes_are_all_reported() -> None:
    """A graph with several faults gets one error per fault, not just the first."""
    obj = operation_set({"to": [1, 5]}, {"operation": "a"}, {"operation": "b"})
    assert [e.path for e in validate_create(obj)] == ["spec.adjacencyList[0].to[1]", "spec.adjacencyList[2]"]


@pytest.mark.parametrize("manifest", [samples.HTTP_OPERATION_DIAGNOSIS, samples.POD_REFERENCE_DIAGNOSIS])
def test_kubediag_v1_single_target_diagnoses_are_admitted(manifest: str) -> None:
    """KubeDiag's samples, with spec.nodeName or spec.podReference and no targetSelector, pass validation."""
    obj = msgspec.yaml.decode(manifest)
    assert validate_create(obj, namespace="default") == ()
    assert isinstance(decode_diagnosis_object(manifest.encode(), fmt="yaml"), Diagnosis)


def test_kubediag_v1_single_targets_run_as_the_equivalent_target_selector() -> None:
    """spec.nodeName is nodeNames of that node; spec.podReference is podReferences of that pod, container kept."""
    by_node = decode_diagnosis_object(samples.HTTP_OPERATION_DIAGNOSIS.encode(), fmt="yaml")
    by_pod = decode_diagnosis_object(samples.POD_REFERENCE_DIAGNOSIS.encode(), fmt="yaml")
    assert isinstance(by_node, Diagnosis)
    assert isinstance(by_pod, Diagnosis)
    assert by_node.spec.targets() == TargetSelector(node_names=("my-node",)).targets()
    pod = PodReference(namespace="default", name="liveness-exec", container="liveness")
    assert by_pod.spec.targets() == TargetSelector(pod_references=(pod,)).targets()
    listed = msgspec.structs.replace(by_node.spec, target_selector=TargetSelector(node_names=("edge-1",)), node_name="")
    assert listed.targets().node_names == ("edge-1",)


def test_diagnosis_and_task_specs_are_immutable() -> None:
    """Changing a Diagnosis's or Task's spec is refused; metadata, status and nulls are not changes."""
    old = diagnosis()
    changed = diagnosis({"nodeNames": ["edge-2"]})
    [error] = validate_update(changed, old)
    assert error.path == "spec"
    assert "a Diagnosis's spec is immutable" in error.message
    relabelled = copy.deepcopy(old) | {"metadata": {"name": "d", "labels": {"a": "b"}}, "status": {"phase": "Running"}}
    relabelled["spec"]["parameters"] = None
    assert validate_update(relabelled, old) == ()
    [error] = validate_update(task(nodeName="edge-2"), task())
    assert "a Task's spec is immutable" in error.message


def test_a_diagnosis_stored_without_defaults_can_still_be_labelled() -> None:
    """A Diagnosis stored while the mutating webhook was away takes a label update, which defaulting
    gives stagePolicy All, without being refused as a spec change; another policy still is one."""
    stored = diagnosis()
    labelled = copy.deepcopy(stored) | {"metadata": {"name": "d", "labels": {"a": "b"}}}
    labelled["spec"]["stagePolicy"] = "All"
    assert validate_update(labelled, stored) == ()
    labelled["spec"]["stagePolicy"] = "Any"
    [error] = validate_update(labelled, stored)
    assert error.path == "spec"


def test_operation_sets_and_operations_may_change_but_stay_valid() -> None:
    """A changed OperationSet or Operation is validated again (a running Diagnosis notices the change)."""
    grown = operation_set({"to": [1, 2]}, {"operation": "a"}, {"operation": "b"})
    assert validate_update(grown, operation_set()) == ()
    broken = operation_set({"to": [1]}, {"operation": "a"}, {"operation": "b"})
    assert [e.path for e in validate_update(broken, operation_set())] == ["spec.adjacencyList[2]"]
    assert validate_update(operation(timeoutSeconds=9), operation()) == ()


def _apply(obj: dict[str, Any], ops: tuple[PatchOperation, ...]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for op in ops:
        assert op.op == "add"
        *parents, key = op.path.strip("/").split("/")
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[key] = op.value
    return out


def test_a_million_empty_target_names_yield_the_first_errors_and_a_remark() -> None:
    """Checking stops after MAX_ERRORS bad names, and the last error says there is more."""
    errors = validate_create(diagnosis({"targetNodeNames": [""] * 1_000_000}))
    assert [e.path for e in errors[:-1]] == [f"spec.targetSelector.targetNodeNames[{i}]" for i in range(MAX_ERRORS)]
    assert errors[-1] == STOPPED


def test_a_graph_too_large_is_refused_before_its_nodes_are_read_and_gets_no_defaults() -> None:
    """100,000 nodes are one error naming the limit (not one per malformed node), and no patch per node."""
    graph = operation_set(*([{"to": "x"}] * 100_000))
    (error,) = validate_create(graph)
    assert str(error) == f"spec.adjacencyList: has 100000 nodes; at most {MAX_NODES} are allowed"
    assert default_patch(graph) == ()


def test_defaults_are_kubediags() -> None:
    """Operation: timeout 30, scheme http, path /; OperationSet: ids; Diagnosis: stagePolicy All; Task: none."""
    op = operation(httpServer={"port": 80})
    patched = _apply(op, default_patch(op))
    assert patched["spec"]["processor"] == {
        "httpServer": {"port": 80, "scheme": "http", "path": "/"},
        "timeoutSeconds": 30,
    }
    graph = operation_set({"to": [1, 2]}, {"operation": "a", "id": None}, {"operation": "b", "id": 2})
    assert [o.path for o in default_patch(graph)] == ["/spec/adjacencyList/0/id", "/spec/adjacencyList/1/id"]
    assert [n["id"] for n in _apply(graph, default_patch(graph))["spec"]["adjacencyList"]] == [0, 1, 2]
    assert default_patch(diagnosis()) == (PatchOperation(op="add", path="/spec/stagePolicy", value="All"),)
    assert default_patch(task()) == ()


def test_explicit_values_and_malformed_objects_get_no_default() -> None:
    """Set fields are left alone, and an object too malformed to locate them gets no patch."""
    assert default_patch(operation(httpServer={"port": 80, "scheme": "https", "path": "/x"}, timeoutSeconds=5)) == ()
    assert default_patch(diagnosis(stagePolicy="Any")) == ()
    assert default_patch({"apiVersion": V1, "kind": "Operation", "spec": {"processor": "x"}}) == ()
    assert default_patch({"apiVersion": V1, "kind": "OperationSet", "spec": {"adjacencyList": ["x"]}}) == ()
    assert default_patch([]) == ()


def test_defaulted_objects_validate_and_decode() -> None:
    """After its defaults, each object is valid and decodes to its type with the defaults in place."""
    for obj, kind in (
        (operation(httpServer={"port": 80}), Operation),
        (operation_set({"to": [1]}, {"operation": "a"}), OperationSet),
        (diagnosis(), Diagnosis),
    ):
        patched = _apply(obj, default_patch(obj))
        assert validate_create(patched) == ()
        decoded = decode_diagnosis_object(msgspec.json.encode(patched))
        assert isinstance(decoded, kind)
        if isinstance(decoded, Diagnosis):
            assert decoded.spec.stage_policy is StagePolicy.ALL
        if isinstance(decoded, OperationSet):
            assert [n.id for n in decoded.spec.adjacency_list] == [0, 1]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
_KEYS = st.sampled_from(
    [
        "processor",
        "httpServer",
        "port",
        "adjacencyList",
        "to",
        "id",
        "operation",
        "targetSelector",
        "nodeNames",
        "podReferences",
        "parameters",
        "operationSet",
        "nodeName",
        "podReference",
        "builtin",
        "scriptRunner",
    ]
)
fielded = st.recursive(
    json_values, lambda inner: st.dictionaries(_KEYS, inner, max_size=4) | st.lists(inner, max_size=3), max_leaves=25
)


@given(st.sampled_from(["Operation", "OperationSet", "Diagnosis", "Task"]), fielded)
def test_any_json_spec_gets_errors_not_exceptions(kind: str, spec: Any) -> None:
    """Whatever the spec, validation returns errors naming fields and never raises."""
    errors = validate_create({"apiVersion": V1, "kind": kind, "spec": spec})
    assert all(e.path and e.message for e in errors)
    for errors_of in (default_patch, lambda o: validate_update(o, {"apiVersion": V1, "kind": kind, "spec": {}})):
        errors_of({"apiVersion": V1, "kind": kind, "spec": spec})
