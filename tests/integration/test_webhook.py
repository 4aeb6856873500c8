"""The admission webhooks registered with the real API server: jobs are defaulted, invalid ones refused.

The webhook server runs in the test's own event loop, so every kubectl call runs in a worker thread:
a blocking call would stop the loop from answering the very webhook call kubectl is waiting for.
"""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import prometheus_client
import pytest
import structlog
import trio

from nodetask.clock import Clock
from roles.common.config import ControllerConfig
from roles.common.health import health_routes, router, serve_http
from roles.common.tls import generate_serving_certificate, server_ssl_context
from roles.controller.admission.registration import (
    CONFIGURATION_NAME,
    VALIDATING_WEBHOOK_NAME,
    register_webhooks,
    webhook_configurations,
)
from roles.controller.admission.reviews import admission_policy, admission_routes
from roles.controller.diagnosis.diagnoses import DiagnosisController
from roles.kube import Kube
from roles.kube.resources import DIAGNOSES, NODES, OPERATIONS
from schemas.core import EDGE_ROLE_LABEL, Node
from schemas.diagnosis.v1 import Diagnosis, Operation, OperationSpec, PodReference
from schemas.meta import ObjectMeta
from schemas.processors import Builtin, Processor
from tests import kubediag_samples as samples
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin
from tests.integration.objects import polled, tasks_of, unique

pytestmark = pytest.mark.integration

V1 = "operations.kubeedge.io/v1alpha1"
V2 = "operations.kubeedge.io/v1alpha2"
DIAG = "diagnosis.kubediag.org/v1"
TEST_LABEL = "nodetaskd-test"


@dataclass
class Cluster:
    """kubectl as admin, off the event loop, with every created job labelled for clean-up."""

    cp: ControlPlane
    run_id: str
    registry: prometheus_client.CollectorRegistry
    port: int = 0
    ca_bundle: bytes = b""

    async def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return await trio.to_thread.run_sync(partial(self.cp.kubectl, *args, input=input, check=False))

    def job(self, kind: str, spec: dict[str, Any], *, api_version: str = V2, name: str = "") -> dict[str, Any]:
        metadata = {"name": name or unique(kind.lower()), "labels": {TEST_LABEL: self.run_id}}
        return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec}

    def diagnosis_object(self, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
        """An Operation, OperationSet, Diagnosis or Task (the last two in namespace default)."""
        obj = self.job(kind, spec, api_version=DIAG)
        if kind in ("Diagnosis", "Task"):
            obj["metadata"]["namespace"] = "default"
        return obj

    async def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> subprocess.CompletedProcess[str]:
        args = ["create", "--validate=false", "-o", "json", "-f", "-"]
        if dry_run:
            args.append("--dry-run=server")
        return await self.kubectl(*args, input=msgspec.json.encode(obj).decode())

    async def get(self, plural: str, name: str) -> Any:
        result = await self.kubectl("get", plural, name, "-o", "json")
        assert result.returncode == 0, result.stderr
        return msgspec.json.decode(result.stdout)

    async def replace(self, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return await self.kubectl(
            "replace", "--validate=false", "-o", "json", "-f", "-", input=msgspec.json.encode(obj).decode()
        )

    async def refused(self, obj: dict[str, Any]) -> str:
        """Create ``obj``, expect the validating webhook to refuse it, and return the API's message."""
        result = await self.create(obj)
        assert result.returncode != 0, f"admitted: {result.stdout}"
        assert f'admission webhook "{VALIDATING_WEBHOOK_NAME}" denied the request' in result.stderr
        return result.stderr


def upgrade_spec(**fields: Any) -> dict[str, Any]:
    return {"version": "v1.21.0", "image": "kubeedge/installation-package", "nodeNames": ["edge-1"]} | fields


def prepull_spec(**fields: Any) -> dict[str, Any]:
    return {"imagePrePullTemplate": {"images": ["busybox:latest"], "nodeNames": ["edge-1"]} | fields}


async def _until(check: Any, *, what: str, limit_s: float = 30) -> None:
    with trio.move_on_after(limit_s):
        while True:
            if await check():
                return
            await trio.sleep(0.2)
    raise AssertionError(f"timed out waiting for: {what}")


@pytest.fixture
async def cluster(crds: ControlPlane, controller_kube: Kube, tmp_path: Path) -> AsyncIterator[Cluster]:
    """The webhooks served over TLS on a free port and registered (as the controller role) until the test ends."""
    log = structlog.get_logger()
    cert = generate_serving_certificate(tmp_path / "tls", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    registry = prometheus_client.CollectorRegistry()
    handler = router(
        [
            *admission_routes(policy=admission_policy(ControllerConfig()), registry=registry, log=log),
            *health_routes(ready=lambda: True, registry=registry),
        ]
    )
    cluster = Cluster(crds, unique("webhook"), registry)
    name = cluster.run_id
    # Probes: dry-run creates show whether each webhook is (still) called.
    invalid = cluster.job("NodeUpgradeJob", upgrade_spec(nodeNames=[]), name=f"{name}-probe")
    valid = cluster.job("NodeUpgradeJob", upgrade_spec(), name=f"{name}-probe")

    async def validating_active() -> bool:
        return VALIDATING_WEBHOOK_NAME in (await cluster.create(invalid, dry_run=True)).stderr

    async def mutating_active() -> bool:
        result = await cluster.create(valid, dry_run=True)
        return result.returncode == 0 and msgspec.json.decode(result.stdout)["spec"].get("concurrency") == 1

    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            partial(serve_http, handler, host="127.0.0.1", port=0, ssl_context=server_ssl_context(cert), log=log)
        )
        # Named as the controller names them: its RBAC lets it patch no other configuration.
        validating, mutating = webhook_configurations(url_base=f"https://127.0.0.1:{port}", ca_bundle=cert.ca_bundle)
        try:
            await register_webhooks(controller_kube, validating, mutating, log=log)
            # The API server picks configurations up from a watch: wait until both are in force.
            await _until(validating_active, what="validating webhook active")
            await _until(mutating_active, what="mutating webhook active")
            cluster.port, cluster.ca_bundle = port, cert.ca_bundle
            yield cluster
        finally:
            with trio.move_on_after(60, shield=True):
                for resource in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
                    await cluster.kubectl("delete", resource, CONFIGURATION_NAME, "--ignore-not-found")
                # Keep serving until the API server has dropped both, so a later test never meets a
                # Fail-policy webhook whose server is gone.
                await _until(lambda: _not(validating_active), what="validating webhook gone")
                await _until(lambda: _not(mutating_active), what="mutating webhook gone")
                await cluster.kubectl(
                    "delete", "nodeupgradejobs,imageprepulljobs,configupdatejobs", "-l", f"{TEST_LABEL}={name}"
                )
                await cluster.kubectl(
                    "delete", "operations,operationsets,diagnoses,tasks", "-A", "-l", f"{TEST_LABEL}={name}"
                )
            nursery.cancel_scope.cancel()


async def _not(check: Any) -> bool:
    return not await check()


async def test_valid_jobs_are_admitted_and_defaulted(cluster: Cluster) -> None:
    """Valid jobs of each kind (v1alpha1 and v1alpha2) are stored with concurrency 1 and timeoutSeconds 300."""
    upgrade = cluster.job("NodeUpgradeJob", upgrade_spec())
    prepull_v1 = cluster.job("ImagePrePullJob", prepull_spec(), api_version=V1)
    config = cluster.job(
        "ConfigUpdateJob", {"updateFields": {"maxCpuUsage": "90"}, "labelSelector": {"matchLabels": {}}}
    )
    explicit = cluster.job("NodeUpgradeJob", upgrade_spec(concurrency=4, timeoutSeconds=60, failureTolerate="0.5"))
    for obj in (upgrade, prepull_v1, config, explicit):
        result = await cluster.create(obj)
        assert result.returncode == 0, result.stderr

    stored = await cluster.get("nodeupgradejobs", upgrade["metadata"]["name"])
    assert (stored["spec"]["concurrency"], stored["spec"]["timeoutSeconds"]) == (1, 300)
    template = (await cluster.get("imageprepulljobs", prepull_v1["metadata"]["name"]))["spec"]["imagePrePullTemplate"]
    assert (template["concurrency"], template["timeoutSeconds"]) == (1, 300)
    stored = await cluster.get("configupdatejobs", config["metadata"]["name"])
    assert (stored["spec"]["concurrency"], stored["spec"]["timeoutSeconds"]) == (1, 300)
    stored = await cluster.get("nodeupgradejobs", explicit["metadata"]["name"])
    assert (stored["spec"]["concurrency"], stored["spec"]["timeoutSeconds"]) == (4, 60)


TAKEOVER_FIELDS = {"hubUrls[0]": "ws://127.0.0.2:1", "tokenFile": "/etc/hostname", "caFile": "/nonexistent"}
"""Settings that would hand an edge to whoever may create a job."""


class Refusal(NamedTuple):
    kind: str
    api_version: str
    spec: dict[str, Any]
    field: str
    says: str


REFUSALS = {
    "bad-version": Refusal(
        "NodeUpgradeJob", V2, upgrade_spec(version="1.21"), "spec.version", "must look like v1.21.0"
    ),
    "bad-version-v1alpha1": Refusal(
        "NodeUpgradeJob", V1, upgrade_spec(version="v1.21"), "spec.version", "must look like v1.21.0"
    ),
    "bad-image": Refusal("NodeUpgradeJob", V2, upgrade_spec(image="installation-package"), "spec.image", "repository"),
    "both-selectors": Refusal(
        "NodeUpgradeJob",
        V2,
        upgrade_spec(labelSelector={"matchLabels": {"a": "b"}}),
        "spec.nodeNames",
        "both NodeNames and LabelSelector are specified",
    ),
    "neither-selector": Refusal(
        "ImagePrePullJob",
        V2,
        prepull_spec(nodeNames=[]),
        "spec.imagePrePullTemplate.nodeNames",
        "both NodeNames and LabelSelector are NOT specified",
    ),
    "empty-images": Refusal(
        "ImagePrePullJob", V1, prepull_spec(images=[]), "spec.imagePrePullTemplate.images", "at least one image"
    ),
    "tolerance-out-of-range": Refusal(
        "NodeUpgradeJob", V2, upgrade_spec(failureTolerate="1.5"), "spec.failureTolerate", "within [0, 1]"
    ),
    "concurrency-0": Refusal("NodeUpgradeJob", V2, upgrade_spec(concurrency=0), "spec.concurrency", "within [1,"),
    "empty-update-fields": Refusal(
        "ConfigUpdateJob", V2, {"updateFields": {}, "nodeNames": ["edge-1"]}, "spec.updateFields", "at least one field"
    ),
    **{
        f"update-{key}": Refusal(
            "ConfigUpdateJob",
            V2,
            {"updateFields": {key: value}, "nodeNames": ["edge-1"]},
            f"spec.updateFields[{key!r}]",
            f"{key} is not a setting a ConfigUpdateJob may change: only configUpdateHealthDeadline, logFormat,",
        )
        for key, value in (
            ("hubUrls[0]", "ws://127.0.0.2:1"),
            ("tokenFile", "/etc/hostname"),
            ("caFile", "/nonexistent"),
        )
    },
    "update-deep-key": Refusal(
        "ConfigUpdateJob",
        V2,
        {"updateFields": {".".join(["a"] * 3000): "1"}, "nodeNames": ["edge-1"]},
        f"spec.updateFields[{'a.' * 20!r}... (5999 characters)]",
        "a field path of 5999 characters is longer than the 128 allowed",
    ),
    "prepull-secret-namespace": Refusal(
        "ImagePrePullJob",
        V1,
        prepull_spec(imageSecrets="default/regcred"),
        "spec.imagePrePullTemplate.imageSecrets",
        "namespace 'default' is not one the hubs read image secrets from: only kube-system"
        " (the controller's and the hubs' imageSecretNamespaces setting)",
    ),
    "update-value": Refusal(
        "ConfigUpdateJob",
        V2,
        {"updateFields": {"maxCpuUsage": "lots"}, "nodeNames": ["edge-1"]},
        "spec.updateFields['maxCpuUsage']",
        "Expected `float`, got `str`",
    ),
    "kubelet-key": Refusal(
        "ConfigUpdateJob",
        V2,
        {"updateFields": {"address": "0.0.0.0"}, "nodeNames": ["edge-1"], "component": "kubelet"},
        "spec.updateFields['address']",
        "address is not a kubelet setting a ConfigUpdateJob may change: only containerLogMaxFiles,",
    ),
    "kubelet-value": Refusal(
        "ConfigUpdateJob",
        V2,
        {"updateFields": {"maxPods": "0"}, "nodeNames": ["edge-1"], "component": "kubelet"},
        "spec.updateFields['maxPods']",
        "maxPods must be an integer from 1 to 10000",
    ),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
async def test_invalid_jobs_are_refused_naming_the_field(cluster: Cluster, case: Refusal) -> None:
    """Each broken rule makes the API server refuse the create with the webhook's message naming the field."""
    message = await cluster.refused(cluster.job(case.kind, case.spec, api_version=case.api_version))
    assert f"{case.field}: " in message
    assert case.says in message


async def test_a_component_no_agent_acts_on_is_refused_by_the_schema_naming_the_ones_it_may_be(
    cluster: Cluster,
) -> None:
    """``component`` is a closed enum in the CRD: the API server refuses any other value before any webhook runs."""
    for kind, spec in (
        ("NodeUpgradeJob", upgrade_spec(component="kubectl")),
        ("ConfigUpdateJob", {"updateFields": {"maxPods": "42"}, "nodeNames": ["edge-1"], "component": "kube-proxy"}),
    ):
        result = await cluster.create(cluster.job(kind, spec))
        assert result.returncode != 0, f"admitted: {result.stdout}"
        assert "spec.component: Unsupported value" in result.stderr, result.stderr
        assert 'supported values: "kubelet", "nodetaskd"' in result.stderr, result.stderr


async def test_spec_is_immutable_but_metadata_and_status_may_change(cluster: Cluster) -> None:
    """An update changing the spec is refused with KubeEdge's text; labels and status still change."""
    job = cluster.job("NodeUpgradeJob", upgrade_spec())
    name = job["metadata"]["name"]
    assert (await cluster.create(job)).returncode == 0

    stored = await cluster.get("nodeupgradejobs", name)
    stored["spec"]["version"] = "v1.22.0"
    result = await cluster.replace(stored)
    assert result.returncode != 0
    assert "spec.version: spec fields are not allowed to update once it's created" in result.stderr

    stored = await cluster.get("nodeupgradejobs", name)
    stored["metadata"]["labels"]["extra"] = "yes"
    result = await cluster.replace(stored)
    assert result.returncode == 0, result.stderr
    # A replace that leaves the defaults out gets them back from the mutating webhook, so its spec
    # still equals the stored one.
    stored = await cluster.get("nodeupgradejobs", name)
    del stored["spec"]["concurrency"], stored["spec"]["timeoutSeconds"]
    result = await cluster.replace(stored)
    assert result.returncode == 0, result.stderr

    status = msgspec.json.encode({"status": {"phase": "InProgress"}}).decode()
    result = await cluster.kubectl(
        "patch", "nodeupgradejob", name, "--subresource=status", "--type=merge", "-p", status
    )
    assert result.returncode == 0, result.stderr
    stored = await cluster.get("nodeupgradejobs", name)
    assert stored["status"]["phase"] == "InProgress"
    assert stored["metadata"]["labels"]["extra"] == "yes"
    assert stored["spec"]["version"] == "v1.21.0"


RETRY = "nodetask.kubeedge.io/retry"


async def _stored_with_status(cluster: Cluster, phase: str, *node_phases: str) -> str:
    """A pre-pull stored with this status (written as the controller would, through the status subresource)."""
    job = cluster.job("ImagePrePullJob", prepull_spec(nodeNames=[f"edge-{i}" for i in range(len(node_phases))]))
    name: str = job["metadata"]["name"]
    assert (await cluster.create(job)).returncode == 0
    entries = [{"nodeName": f"edge-{i}", "phase": p} for i, p in enumerate(node_phases)]
    status = msgspec.json.encode({"status": {"phase": phase, "nodeStatus": entries}}).decode()
    result = await cluster.kubectl(
        "patch", "imageprepulljob", name, "--subresource=status", "--type=merge", "-p", status
    )
    assert result.returncode == 0, result.stderr
    return name


async def test_a_retry_of_a_job_still_in_progress_is_refused_with_the_reason(cluster: Cluster) -> None:
    """kubectl annotate of a new retry value on an InProgress job is denied, saying why; on a Failure job it passes."""
    running = await _stored_with_status(cluster, "InProgress", "Failure", "InProgress")
    result = await cluster.kubectl("annotate", "imageprepulljob", running, f"{RETRY}=1")
    assert result.returncode != 0
    assert f'admission webhook "{VALIDATING_WEBHOOK_NAME}" denied the request' in result.stderr
    assert f"metadata.annotations[{RETRY}]: cannot retry: the job is InProgress" in result.stderr

    failed = await _stored_with_status(cluster, "Failure", "Failure", "Successful")
    result = await cluster.kubectl("annotate", "imageprepulljob", failed, f"{RETRY}=1")
    assert result.returncode == 0, result.stderr


async def test_a_failure_job_may_tune_its_retry_but_an_immutable_field_is_refused_naming_it(cluster: Cluster) -> None:
    """On a Failure job, concurrency may change before a retry; its images may not, and the refusal names them."""
    name = await _stored_with_status(cluster, "Failure", "Failure")
    tune = msgspec.json.encode({"spec": {"imagePrePullTemplate": {"concurrency": 4, "retryTimes": 2}}}).decode()
    result = await cluster.kubectl("patch", "imageprepulljob", name, "--type=merge", "-p", tune)
    assert result.returncode == 0, result.stderr
    template = (await cluster.get("imageprepulljobs", name))["spec"]["imagePrePullTemplate"]
    assert (template["concurrency"], template["retryTimes"]) == (4, 2)

    change = msgspec.json.encode({"spec": {"imagePrePullTemplate": {"images": ["busybox:1.36"]}}}).decode()
    result = await cluster.kubectl("patch", "imageprepulljob", name, "--type=merge", "-p", change)
    assert result.returncode != 0
    assert (
        "spec.imagePrePullTemplate.images: spec fields are not allowed to update once it's created"
        " (only timeoutSeconds, concurrency, failureTolerate, checkItems, retryTimes, imageSecrets may change"
        " before a retry; a different node task is a new job)"
    ) in result.stderr


async def test_decisions_are_counted_and_exposed_on_metrics(cluster: Cluster) -> None:
    """The decision counter moves with each review the API server sends, and /metrics shows it over TLS."""
    metric = "nodetaskd_controller_admission_decisions_total"
    labels = {"webhook": "validating", "kind": "NodeUpgradeJob", "allowed": "false"}
    before = cluster.registry.get_sample_value(metric, labels) or 0.0
    await cluster.refused(cluster.job("NodeUpgradeJob", upgrade_spec(version="bogus")))
    assert cluster.registry.get_sample_value(metric, labels) == before + 1
    mutated = {"webhook": "mutating", "kind": "NodeUpgradeJob", "allowed": "true"}
    assert (cluster.registry.get_sample_value(metric, mutated) or 0) >= 1

    context = ssl.create_default_context(cadata=cluster.ca_bundle.decode())
    stream = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", cluster.port), context, server_hostname="127.0.0.1")
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
        reply = b""
        while chunk := await stream.receive_some(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 ")
    line = f'{metric}{{allowed="false",kind="NodeUpgradeJob",webhook="validating"}} {before + 1}'
    assert line.encode() in reply


async def test_registering_again_updates_the_configurations_in_place(cluster: Cluster, controller_kube: Kube) -> None:
    """A second registration (a restart with a new port or CA) patches the existing configurations."""
    validating, mutating = webhook_configurations(
        url_base=f"https://127.0.0.1:{cluster.port}", ca_bundle=cluster.ca_bundle, timeout_seconds=7
    )
    await register_webhooks(controller_kube, validating, mutating, log=structlog.get_logger())
    for resource in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        result = await cluster.kubectl("get", resource, CONFIGURATION_NAME, "-o", "json")
        assert result.returncode == 0, result.stderr
        (webhook,) = msgspec.json.decode(result.stdout)["webhooks"]
        assert webhook["timeoutSeconds"] == 7
    await cluster.refused(cluster.job("NodeUpgradeJob", upgrade_spec(version="still-checked")))


DIAGNOSIS_REFUSALS = {
    "function-processor": Refusal(
        "Operation",
        DIAG,
        {"processor": {"function": {"runtime": "python3", "codeSource": {"handler.py": "x"}}}},
        "spec.processor.function",
        "not supported by nodetaskd",
    ),
    "two-processors": Refusal(
        "Operation",
        DIAG,
        {"processor": {"builtin": {"name": "node.resources"}, "httpServer": {"port": 80}}},
        "spec.processor",
        "must set exactly one of httpServer, scriptRunner, builtin, got httpServer, builtin",
    ),
    "unreachable-node": Refusal(
        "OperationSet",
        DIAG,
        {"adjacencyList": [{"to": [1]}, {"operation": "a"}, {"operation": "b"}]},
        "spec.adjacencyList[2]",
        "node 2 (b) is not reachable from the start node 0",
    ),
    "cycle": Refusal(
        "OperationSet",
        DIAG,
        {"adjacencyList": [{"to": [1]}, {"operation": "a", "to": [2]}, {"operation": "b", "to": [1]}]},
        "spec.adjacencyList[1].to",
        "is on the cycle 1 -> 2 -> 1",
    ),
    "two-targets": Refusal(
        "Diagnosis",
        DIAG,
        {"operationSet": "g", "targetSelector": {"nodeNames": ["a"], "podSelector": {"matchLabels": {"a": "b"}}}},
        "spec.targetSelector",
        "got nodeNames, podSelector",
    ),
    "telemetry-parameter": Refusal(
        "Diagnosis",
        DIAG,
        {"operationSet": "g", "targetSelector": {"nodeNames": ["a"]}, "parameters": {"node": "x"}},
        "spec.parameters['node']",
        "is set by nodetaskd for every Task",
    ),
    "parameters-over-64-kib": Refusal(
        "Diagnosis",
        DIAG,
        {"operationSet": "g", "targetSelector": {"nodeNames": ["a"]}, "parameters": {"p": "x" * (64 << 10)}},
        "spec.parameters",
        "take 65544 bytes as JSON; a Diagnosis's may take at most 65536",
    ),
    "too-many-node-names": Refusal(
        "Diagnosis",
        DIAG,
        {"operationSet": "g", "targetSelector": {"nodeNames": [f"n{i}" for i in range(5001)]}},
        "spec.targetSelector.nodeNames",
        "lists 5001 targets; a Diagnosis may have at most 5000",
    ),
    "pod-of-another-namespace": Refusal(
        "Diagnosis",
        DIAG,
        {"operationSet": "g", "targetSelector": {"podReferences": [{"namespace": "kube-system", "name": "p"}]}},
        "spec.targetSelector.podReferences[0].namespace",
        "must be the Diagnosis's own namespace 'default', got 'kube-system'",
    ),
    "task-without-node": Refusal("Task", DIAG, {"operation": "collect"}, "spec.nodeName", "is required"),
}


@pytest.mark.parametrize("case", DIAGNOSIS_REFUSALS.values(), ids=DIAGNOSIS_REFUSALS.keys())
async def test_invalid_diagnosis_objects_are_refused_naming_the_field(cluster: Cluster, case: Refusal) -> None:
    """Each kind of diagnosis.kubediag.org goes through the validating webhook, which names the field."""
    message = await cluster.refused(cluster.diagnosis_object(case.kind, case.spec))
    assert f"{case.field}: " in message
    assert case.says in message


async def test_diagnosis_objects_are_defaulted_and_a_diagnosis_spec_is_immutable(cluster: Cluster) -> None:
    """Operation, OperationSet and Diagnosis get KubeDiag's defaults; a Diagnosis's spec cannot change later,
    its labels can."""
    operation = cluster.diagnosis_object("Operation", {"processor": {"httpServer": {"port": 8080}}})
    opset = cluster.diagnosis_object("OperationSet", {"adjacencyList": [{"to": [1]}, {"operation": "collect"}]})
    diagnosis = cluster.diagnosis_object("Diagnosis", {"operationSet": "g", "targetSelector": {"nodeNames": ["a"]}})
    for obj in (operation, opset, diagnosis):
        result = await cluster.create(obj)
        assert result.returncode == 0, result.stderr

    stored = await cluster.get("operations", operation["metadata"]["name"])
    assert stored["spec"]["processor"] == {
        "httpServer": {"port": 8080, "scheme": "http", "path": "/"},
        "timeoutSeconds": 30,
    }
    stored = await cluster.get("operationsets", opset["metadata"]["name"])
    assert [node.get("id") for node in stored["spec"]["adjacencyList"]] == [0, 1]
    stored = await cluster.get("diagnoses", diagnosis["metadata"]["name"])
    assert stored["spec"]["stagePolicy"] == "All"

    stored["spec"]["targetSelector"]["nodeNames"] = ["b"]
    result = await cluster.replace(stored)
    assert result.returncode != 0
    assert "spec: a Diagnosis's spec is immutable" in result.stderr
    stored = await cluster.get("diagnoses", diagnosis["metadata"]["name"])
    stored["metadata"]["labels"]["extra"] = "yes"
    result = await cluster.replace(stored)
    assert result.returncode == 0, result.stderr


def _pod_reference_diagnosis(pod: str) -> str:
    """A Diagnosis written as KubeDiag v1's DiagnosisSpec documents spec.podReference (namespace, name,
    container), over the sample's OperationSet."""
    return f"""\
apiVersion: diagnosis.kubediag.org/v1
kind: Diagnosis
metadata:
  name: pod-reference
spec:
  operationSet: http-operation
  podReference:
    namespace: default
    name: {pod}
    container: c
"""


async def test_kubediag_single_target_samples_are_applied_and_their_tasks_go_to_the_named_node(
    cluster: Cluster, controller_kube: Kube
) -> None:
    """kubectl apply of KubeDiag's http-operation sample (spec.nodeName: my-node) and of a Diagnosis with
    spec.podReference passes the CRD and the webhooks; a running controller gives the first a Task on my-node and
    the second one on the node its pod runs on, carrying the pod."""
    pod_node, pod = unique("edge"), unique("web")
    operation = Operation(
        metadata=ObjectMeta(name="http-operation"),
        spec=OperationSpec(Processor(builtin=Builtin(name="node.resources"), timeout_seconds=30)),
    )
    pod_doc = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod},
        "spec": {
            "nodeName": pod_node,
            "containers": [{"name": "c", "image": "busybox"}],
            "automountServiceAccountToken": False,
        },
    }
    controller = DiagnosisController(kube=controller_kube, clock=Clock.start(), log=structlog.get_logger())
    made: list[Diagnosis] = []
    async with admin(cluster.cp) as kube, trio.open_nursery() as nursery:
        await nursery.start(controller.run)
        try:
            for name in ("my-node", pod_node):
                await kube.create(NODES, Node(metadata=ObjectMeta(name=name, labels={EDGE_ROLE_LABEL: ""})))
            await kube.create(OPERATIONS, operation)
            # Pod admission wants the namespace's default ServiceAccount (the controller manager may not have made it).
            await cluster.kubectl("create", "serviceaccount", "default", "-n", "default")
            created = await cluster.kubectl("create", "-n", "default", "-f", "-", input=json.dumps(pod_doc))
            assert created.returncode == 0, created.stderr
            for manifest in (
                samples.HTTP_OPERATION_SET,
                samples.HTTP_OPERATION_DIAGNOSIS,
                _pod_reference_diagnosis(pod),
            ):
                applied = await cluster.kubectl("apply", "-n", "default", "-f", "-", input=manifest)
                assert applied.returncode == 0, applied.stderr

            listed = await cluster.kubectl("get", "diagnosis", "-n", "default", "http-operation", "pod-reference")
            assert listed.returncode == 0, listed.stderr
            by_node = await kube.get(DIAGNOSES, "http-operation", namespace="default")
            by_pod = await kube.get(DIAGNOSES, "pod-reference", namespace="default")
            made += [by_node, by_pod]
            assert (by_node.spec.node_name, by_node.spec.parameters) == ("my-node", {"b": "200", "f": "6"})
            [task] = await polled(lambda: tasks_of(kube, by_node), bool)
            assert (task.spec.node_name, task.spec.pod_reference) == ("my-node", None)
            [task] = await polled(lambda: tasks_of(kube, by_pod), bool)
            assert task.spec.node_name == pod_node
            assert task.spec.pod_reference == PodReference(namespace="default", name=pod, container="c")
        finally:
            with trio.move_on_after(60, shield=True):
                for name in ("http-operation", "pod-reference"):
                    await cluster.kubectl("delete", "diagnosis", "-n", "default", name, "--ignore-not-found")
                # The controller removes the Tasks' finalizers: wait for them while it still runs.
                for diagnosis in made:
                    await polled(partial(tasks_of, kube, diagnosis), _empty, limit_s=60)
                await cluster.kubectl("delete", "pod", "-n", "default", pod, "--grace-period=0", "--force")
                await cluster.kubectl("delete", "operationset,operation", "http-operation", "--ignore-not-found")
                await cluster.kubectl("delete", "node", "my-node", pod_node, "--ignore-not-found")
            nursery.cancel_scope.cancel()


def _empty(items: list[Any]) -> bool:
    return not items
