"""A Diagnosis that targets a pod (``targetPodSelector``) whose container really runs on a device: the
controller, a hub relaying the device's API requests and two agents as processes, a stock kubelet and
containerd behind the first agent (``device_nodes``)."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import pytest

from roles.kube import NotFound
from roles.kube.resources import DIAGNOSES, OPERATION_SETS, OPERATIONS
from schemas.diagnosis.v1 import (
    AdjacencyNode,
    Diagnosis,
    DiagnosisPhase,
    DiagnosisSpec,
    Operation,
    OperationSet,
    OperationSetSpec,
    OperationSpec,
    TargetSelector,
    TaskPhase,
)
from schemas.meta import LabelSelector, ObjectMeta
from schemas.processors import Processor, ScriptRunner
from tests.integration.controlplane import ControlPlane
from tests.integration.device_nodes import HUB_OPTIONS, device_node, eventually, node_api
from tests.integration.fleet import admin
from tests.integration.objects import diagnosis_when, finished, tasks_of, unique
from tests.integration.processes import fleet
from tests.integration.real_nodes import create, serving_pod
from tools.ports import free_port
from tools.provision.node import web_pod

pytestmark = [pytest.mark.integration, pytest.mark.slow(75)]

SCRIPT = "#!/bin/sh\nprintf 'checked on %s\\n' \"$1\"\n"


async def test_a_pod_selector_sends_the_diagnosis_task_to_the_device_whose_kubelet_runs_the_pod(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """With a pod running on the first device's kubelet (through its agent), a Diagnosis selecting that pod
    by label gets one Task, for that device, which its agent's script processor completes; the second
    device, with no pod, gets none."""
    cp = crds
    port = free_port()
    digest = hashlib.sha256(SCRIPT.encode()).hexdigest()
    scripts = {"diagnosis": {"scripts": {"enabled": True, "allowedSha256": [digest]}}}

    def options(index: int) -> dict[str, object]:
        return {**scripts, **(node_api(port) if index == 0 else {})}

    namespace, app, name = unique("diag"), unique("app"), unique("pod-diag")
    cp.kubectl("create", "namespace", namespace)
    async with (
        fleet(cp, tmp_path, edges=2, hubs=1, hub_options=HUB_OPTIONS, edge_options=options) as running,
        admin(cp) as kube,
    ):
        device, other = running.edges
        async with device_node(cp, tmp_path, device, port):
            pod = web_pod("web", device)
            pod["metadata"]["labels"] = {"app": app}
            create(cp, namespace, pod)
            await eventually("pod serving", lambda: serving_pod(cp, namespace, "web"))

            runner = ScriptRunner(script=SCRIPT, arg_keys=("node",), operation_result_key="check")
            operation = Operation(
                metadata=ObjectMeta(name=name), spec=OperationSpec(processor=Processor(script_runner=runner))
            )
            graph = (AdjacencyNode(to=(1,)), AdjacencyNode(operation=name))
            stages = OperationSet(metadata=ObjectMeta(name=name), spec=OperationSetSpec(adjacency_list=graph))
            targets = TargetSelector(target_pod_selector=LabelSelector(match_labels={"app": app}))
            diagnosis = Diagnosis(
                metadata=ObjectMeta(name=name, namespace=namespace),
                spec=DiagnosisSpec(operation_set=name, target_selector=targets),
            )
            await kube.create(OPERATIONS, operation)
            await kube.create(OPERATION_SETS, stages)
            try:
                created = await kube.create(DIAGNOSES, diagnosis, namespace=namespace)
                done = await diagnosis_when(kube, name, finished, namespace=namespace, limit_s=90)
                tasks = await tasks_of(kube, created)
            finally:
                for resource, ns in ((DIAGNOSES, namespace), (OPERATION_SETS, ""), (OPERATIONS, "")):
                    with contextlib.suppress(NotFound):
                        await kube.delete(resource, name, namespace=ns)
                cp.kubectl("delete", "namespace", namespace, "--wait=false")

    assert done.status.phase is DiagnosisPhase.SUCCEEDED
    assert [(t.spec.node_name, t.status.phase) for t in tasks] == [(device, TaskPhase.SUCCEEDED)]
    assert tasks[0].status.results == {"operation.check.output": f"checked on {device}\n"}
    assert other not in {t.spec.node_name for t in tasks}
