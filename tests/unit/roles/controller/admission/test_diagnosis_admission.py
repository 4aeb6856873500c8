"""The webhooks apply the diagnosis rules to diagnosis.kubediag.org objects and are registered for them."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import prometheus_client
import structlog

from roles.common.config import ControllerConfig
from roles.common.health import Request, router
from roles.controller.admission.registration import webhook_configurations
from roles.controller.admission.reviews import (
    MUTATE_PATH,
    VALIDATE_PATH,
    admission_policy,
    admission_routes,
)
from schemas.diagnosis.v1 import DEFAULT_MAX_TARGETS

V1 = "diagnosis.kubediag.org/v1"


def _review(operation: str, obj: dict[str, Any], old: object = None, **extra: Any) -> bytes:
    request = {
        "uid": "u-1",
        "kind": {"group": "diagnosis.kubediag.org", "version": "v1", "kind": obj["kind"]},
        "operation": operation,
        "name": obj["metadata"]["name"],
        "object": obj,
        "oldObject": old,
        **extra,
    }
    return msgspec.json.encode({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})


async def _answer(
    path: str,
    body: bytes,
    registry: prometheus_client.CollectorRegistry | None = None,
    *,
    config: ControllerConfig | None = None,
) -> Any:
    routes = admission_routes(
        policy=admission_policy(config or ControllerConfig()),
        registry=registry or prometheus_client.CollectorRegistry(),
        log=structlog.get_logger(),
    )
    response = await router(routes)(Request(method="POST", path=path, query="", headers=(), body=body))
    assert response.status == 200
    return msgspec.json.decode(response.body)["response"]


def _diagnosis(**spec: Any) -> dict[str, Any]:
    base = {"operationSet": "g", "targetSelector": {"nodeNames": ["edge-1"]}}
    return {"apiVersion": V1, "kind": "Diagnosis", "metadata": {"name": "d", "namespace": "n"}, "spec": base | spec}


async def test_diagnosis_objects_are_validated_by_the_diagnosis_rules() -> None:
    """An invalid Diagnosis is denied naming its field, and the decision is counted under its kind."""
    registry = prometheus_client.CollectorRegistry()
    answer = await _answer(VALIDATE_PATH, _review("CREATE", _diagnosis(stagePolicy="Most")), registry)
    assert answer["allowed"] is False
    assert answer["status"]["message"].startswith("spec.stagePolicy: must be All")
    labels = {"webhook": "validating", "kind": "Diagnosis", "allowed": "false"}
    assert registry.get_sample_value("nodetaskd_controller_admission_decisions_total", labels) == 1.0
    assert (await _answer(VALIDATE_PATH, _review("CREATE", _diagnosis())))["allowed"] is True


async def test_a_diagnosis_is_checked_against_the_controllers_target_limit_and_the_requests_namespace() -> None:
    """``diagnosisMaxTargets`` bounds the node names a Diagnosis lists; a pod reference must name the
    request's namespace when the object does not name one yet (the API server fills it in after admission)."""
    three = _diagnosis(targetSelector={"nodeNames": ["a", "b", "c"]})
    config = ControllerConfig(diagnosis_max_targets=2)
    answer = await _answer(VALIDATE_PATH, _review("CREATE", three), config=config)
    assert answer["allowed"] is False
    assert answer["status"]["message"] == (
        "spec.targetSelector.nodeNames: lists 3 targets; a Diagnosis may have at most 2"
    )
    assert (await _answer(VALIDATE_PATH, _review("CREATE", three)))["allowed"] is True
    elsewhere = _diagnosis(targetSelector={"podReferences": [{"namespace": "kube-system", "name": "p"}]})
    del elsewhere["metadata"]["namespace"]
    answer = await _answer(VALIDATE_PATH, _review("CREATE", elsewhere, namespace="n"))
    assert answer["allowed"] is False
    assert answer["status"]["message"].startswith(
        "spec.targetSelector.podReferences[0].namespace: must be the Diagnosis's own namespace 'n'"
    )
    assert (await _answer(VALIDATE_PATH, _review("CREATE", elsewhere, namespace="kube-system")))["allowed"] is True


def test_the_controllers_target_limit_defaults_to_the_rules_own() -> None:
    """diagnosisMaxTargets (written out in roles.common.config, which the launcher loads) is the rules' default."""
    assert ControllerConfig().diagnosis_max_targets == DEFAULT_MAX_TARGETS


async def test_diagnosis_spec_changes_are_denied_but_status_writes_are_not_checked() -> None:
    """An UPDATE changing a Diagnosis's spec is denied; its status subresource is never validated."""
    changed = _diagnosis(targetSelector={"nodeNames": ["edge-2"]})
    answer = await _answer(VALIDATE_PATH, _review("UPDATE", changed, _diagnosis()))
    assert answer["allowed"] is False
    assert "spec: a Diagnosis's spec is immutable" in answer["status"]["message"]
    status = await _answer(VALIDATE_PATH, _review("UPDATE", changed, _diagnosis(), subResource="status"))
    assert status["allowed"] is True


async def test_diagnosis_defaults_come_from_the_mutating_webhook() -> None:
    """A Diagnosis without stagePolicy gets All, an OperationSet its node ids, as a JSON Patch."""
    answer = await _answer(MUTATE_PATH, _review("CREATE", _diagnosis()))
    assert answer["patchType"] == "JSONPatch"
    patch = msgspec.json.decode(base64.b64decode(answer["patch"]))
    assert patch == [{"op": "add", "path": "/spec/stagePolicy", "value": "All"}]
    opset = {
        "apiVersion": V1,
        "kind": "OperationSet",
        "metadata": {"name": "g"},
        "spec": {"adjacencyList": [{"to": [1]}, {"operation": "collect"}]},
    }
    answer = await _answer(MUTATE_PATH, _review("CREATE", opset))
    patch = msgspec.json.decode(base64.b64decode(answer["patch"]))
    assert [op["path"] for op in patch] == ["/spec/adjacencyList/0/id", "/spec/adjacencyList/1/id"]


def test_configurations_send_the_diagnosis_kinds_to_the_webhooks() -> None:
    """Validating covers all four kinds at any scope; mutating the three with defaults, not Tasks."""
    validating, mutating = webhook_configurations(url_base="https://127.0.0.1:9443", ca_bundle=b"pem")
    (validating_hook,) = validating.webhooks
    (mutating_hook,) = mutating.webhooks
    [checked] = [r for r in validating_hook.rules if r.api_groups == ("diagnosis.kubediag.org",)]
    assert checked.resources == ("operations", "operationsets", "diagnoses", "tasks")
    assert (checked.api_versions, checked.scope, checked.operations) == (("v1",), "*", ("CREATE", "UPDATE"))
    [defaulted] = [r for r in mutating_hook.rules if r.api_groups == ("diagnosis.kubediag.org",)]
    assert defaulted.resources == ("operations", "operationsets", "diagnoses")
    jobs = [r.resources for r in validating_hook.rules if r.api_groups == ("operations.kubeedge.io",)]
    assert jobs == [("nodeupgradejobs",), ("imageprepulljobs",), ("configupdatejobs",)]
