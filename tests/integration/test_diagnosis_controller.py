"""The diagnosis controller against the real API server; the test plays the hubs and edges by writing Task status."""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import msgspec
import pytest
import structlog

from flows.diagnosis.counted import CountedNodes
from flows.diagnosis.pipeline import HASH_LABEL
from flows.diagnosis.tasks import DIAGNOSIS_UID_LABEL, TASK_FINALIZER
from nodetask.clock import Clock
from roles.controller.diagnosis.diagnoses import DiagnosisController
from roles.kube import ApiError, Kube, NotFound
from roles.kube.resources import DIAGNOSES, NODES, OPERATION_SETS, OPERATIONS, TASKS
from schemas.core import EDGE_ROLE_LABEL, Node
from schemas.diagnosis.v1 import (
    AdjacencyNode,
    Diagnosis,
    DiagnosisPhase,
    DiagnosisSpec,
    Operation,
    OperationSet,
    OperationSetSpec,
    OperationSpec,
    PodReference,
    StagePolicy,
    TargetSelector,
    Task,
    TaskPhase,
)
from schemas.meta import LabelSelector, ObjectMeta
from schemas.processors import Builtin, Processor
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin
from tests.integration.objects import answer_task, diagnosis_when, finished, kubectl, polled, tasks_of, unique
from tests.integration.processes import recording
from tools.processes import terminate

pytestmark = pytest.mark.integration
NS = "default"
OTHER_NS = "kube-system"
"""A namespace whose pods a Diagnosis in ``NS`` must not reach."""

Verdict = tuple[bool, dict[str, str]] | None
"""What the test's hub does with a Task: (succeeded, results), or nothing at all."""


class Objects:
    """Creates one test's objects as an administrator, and removes them while a controller still runs."""

    def __init__(self, cp: ControlPlane, kube: Kube) -> None:
        self.cp = cp
        self.kube = kube
        self.diagnoses: list[Diagnosis] = []
        self.cluster_scoped: list[tuple[Any, str]] = []
        self.pods: list[tuple[str, str]] = []
        self.prefix = unique("t")

    async def operations(self, *names: str, timeout_seconds: int = 30) -> list[str]:
        """Builtin Operations (what they run does not matter: the test answers for the edges)."""
        out = []
        for name in names:
            full = f"{self.prefix}-{name}"
            processor = Processor(builtin=Builtin(name="node.resources"), timeout_seconds=timeout_seconds)
            await self.kube.create(OPERATIONS, Operation(metadata=ObjectMeta(name=full), spec=OperationSpec(processor)))
            self.cluster_scoped.append((OPERATIONS, full))
            out.append(full)
        return out

    async def operation_set(self, successors: list[list[int]], operations: Sequence[str]) -> OperationSet:
        """Node ``i`` leads to ``successors[i]`` and runs ``operations[i - 1]`` (node 0 is the start)."""
        nodes = tuple(
            AdjacencyNode(to=tuple(to), operation=operations[i - 1] if i else "") for i, to in enumerate(successors)
        )
        name = f"{self.prefix}-set-{len(self.cluster_scoped)}"
        obj = OperationSet(metadata=ObjectMeta(name=name), spec=OperationSetSpec(adjacency_list=nodes))
        created = await self.kube.create(OPERATION_SETS, obj)
        self.cluster_scoped.append((OPERATION_SETS, name))
        return created

    async def diagnosis(self, operation_set: str, targets: TargetSelector, **spec: Any) -> Diagnosis:
        name = f"{self.prefix}-diag-{len(self.diagnoses)}"
        obj = Diagnosis(
            metadata=ObjectMeta(name=name, namespace=NS),
            spec=DiagnosisSpec(operation_set=operation_set, target_selector=targets, **spec),
        )
        created = await self.kube.create(DIAGNOSES, obj, namespace=NS)
        self.diagnoses.append(created)
        return created

    async def nodes(self, *names: str, edge: bool = True, **labels: str) -> None:
        """Nodes of ``names`` (edge nodes unless not ``edge``), all at once: a Diagnosis's Tasks are for these."""
        role = {EDGE_ROLE_LABEL: ""} if edge else {}

        async def create(name: str) -> None:
            await self.kube.create(NODES, Node(metadata=ObjectMeta(name=name, labels={**labels, **role})))

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(create, name)
                self.cluster_scoped.append((NODES, name))

    async def edges(self, count: int, *, length: int = 0) -> tuple[str, ...]:
        """``count`` new edge Nodes' names (padded to ``length`` characters when given)."""
        prefix = unique("edge")
        names = tuple(f"{prefix}-{i:04d}".ljust(length, "n") for i in range(count))
        await self.nodes(*names)
        return names

    async def pod(self, name: str, *, node: str = "", namespace: str = NS, **labels: str) -> None:
        """A pod bound to ``node`` (as a scheduler binds one), or not yet scheduled."""
        spec: dict[str, Any] = {
            "containers": [{"name": "c", "image": "busybox"}],
            "automountServiceAccountToken": False,
        }
        if node:
            spec["nodeName"] = node
        doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}
        await anyio.to_thread.run_sync(
            functools.partial(self.cp.kubectl, "create", "-n", namespace, "-f", "-", input=json.dumps(doc))
        )
        self.pods.append((namespace, name))

    async def cleanup(self) -> None:
        """Delete the Diagnoses and wait until the controller has removed their Tasks; then the rest."""
        for diagnosis in self.diagnoses:
            with contextlib.suppress(NotFound):
                await self.kube.delete(DIAGNOSES, diagnosis.metadata.name, namespace=NS)
        for diagnosis in self.diagnoses:
            await polled(functools.partial(tasks_of, self.kube, diagnosis), _empty, limit_s=60)

        async def delete(resource: Any, name: str) -> None:
            with contextlib.suppress(NotFound):
                await self.kube.delete(resource, name)

        async with anyio.create_task_group() as tg:
            for resource, name in self.cluster_scoped:
                tg.start_soon(delete, resource, name)
        for namespace in {namespace for namespace, _ in self.pods}:
            # No kubelet confirms a pod's end here: delete at once.
            names = [name for where, name in self.pods if where == namespace]
            await kubectl(self.cp, "delete", "pod", "-n", namespace, "--grace-period=0", "--force", *names)
        self.diagnoses.clear()
        self.cluster_scoped.clear()
        self.pods.clear()


@pytest.fixture
async def admin_kube(crds: ControlPlane) -> AsyncIterator[Kube]:
    async with admin(crds) as kube:
        yield kube


@asynccontextmanager
async def running(kube: Kube, **options: Any) -> AsyncIterator[DiagnosisController]:
    """A diagnosis controller (``options`` for its constructor), ready (every watch listed) on entry and stopped
    on exit."""
    controller = DiagnosisController(kube=kube, clock=Clock.start(), log=structlog.get_logger(), **options)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        yield controller
        tg.cancel_scope.cancel()


@pytest.fixture
async def controller(crds: ControlPlane, controller_kube: Kube) -> AsyncIterator[DiagnosisController]:
    """A running diagnosis controller authenticated as the controller role."""
    async with running(controller_kube) as controller:
        yield controller


@pytest.fixture
async def objects(crds: ControlPlane, admin_kube: Kube, controller: DiagnosisController) -> AsyncIterator[Objects]:
    made = Objects(crds, admin_kube)
    try:
        yield made
    finally:
        await made.cleanup()


@pytest.fixture
async def pods_allowed(crds: ControlPlane) -> None:
    """The namespaces' default ServiceAccount, which pod admission wants (the controller manager may not have made
    it yet)."""
    for namespace in (NS, OTHER_NS):
        await anyio.to_thread.run_sync(
            functools.partial(crds.kubectl, "create", "serviceaccount", "default", "-n", namespace, check=False)
        )


@asynccontextmanager
async def hub(kube: Kube, diagnosis: Diagnosis, decide: Callable[[Task], Verdict]) -> AsyncIterator[None]:
    """Answer each new Task of ``diagnosis`` as ``decide`` says, as a hub and its edge would, while inside."""

    async def answer() -> None:
        answered: set[str] = set()
        while True:
            for task in await tasks_of(kube, diagnosis):
                if task.metadata.name in answered:
                    continue
                answered.add(task.metadata.name)
                verdict = decide(task)
                if verdict is not None:
                    await answer_task(kube, task, ok=verdict[0], results=verdict[1])
            await anyio.sleep(0.1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(answer)
        yield
        tg.cancel_scope.cancel()


def _empty(items: Sequence[object]) -> bool:
    return not items


def _at_least(count: int, items: Sequence[object]) -> bool:
    return len(items) >= count


def ids(path: Sequence[AdjacencyNode]) -> list[int | None]:
    return [node.id for node in path]


async def _exists(kube: Kube, diagnosis: Diagnosis) -> bool:
    try:
        await kube.get(DIAGNOSES, diagnosis.metadata.name, namespace=NS)
    except NotFound:
        return False
    return True


async def reasons(cp: ControlPlane, diagnosis: Diagnosis, *, until: str) -> list[str]:
    """The reasons of the Events on ``diagnosis`` once one says ``until`` (Events follow status writes)."""
    with anyio.fail_after(20):
        while True:
            result = await kubectl(
                cp,
                "get",
                "events",
                "-n",
                NS,
                "--field-selector",
                f"involvedObject.uid={diagnosis.metadata.uid}",
                "-o",
                "json",
            )
            items = msgspec.json.decode(result.stdout)["items"]
            found = [e["reason"] for e in items]
            if until in found:
                return found
            await anyio.sleep(0.1)


async def test_a_failed_path_falls_back_without_rerunning_the_shared_stage_and_passes_results_on(
    crds: ControlPlane, objects: Objects, admin_kube: Kube
) -> None:
    """check fails on one node: path 0 fails, path 1 runs only other (collect is shared and not run again), and
    other's Tasks get collect's results from their own node; failedPaths, succeededPath, context and Events say so."""
    collect, check, other = await objects.operations("collect", "check", "other")
    opset = await objects.operation_set([[1], [2, 3], [], []], [collect, check, other])
    edges = list(await objects.edges(2))
    diagnosis = await objects.diagnosis(
        opset.metadata.name, TargetSelector(node_names=tuple(edges)), parameters={"target": "10.0.0.1"}
    )

    def decide(task: Task) -> Verdict:
        node = task.spec.node_name
        if task.spec.operation == collect:
            return True, {"addr": f"addr-of-{node}"}
        if task.spec.operation == check:
            return node == edges[0], {}
        return True, {"seen": task.spec.parameters.get(f"{collect}.addr", "")}

    async with hub(admin_kube, diagnosis, decide):
        done = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
    assert done.status.phase is DiagnosisPhase.SUCCEEDED
    assert [ids(p) for p in done.status.failed_paths] == [[1, 2]]
    assert ids(done.status.succeeded_path) == [1, 3]
    assert done.status.node_names == tuple(edges)

    tasks = await tasks_of(admin_kube, diagnosis)
    assert sorted((t.spec.operation, t.spec.node_name) for t in tasks) == sorted(
        (op, node) for op in (collect, check, other) for node in edges
    )
    for task in tasks:
        assert task.metadata.finalizers == (TASK_FINALIZER,)
        assert [(o.kind, o.uid) for o in task.metadata.owner_references] == [("Diagnosis", diagnosis.metadata.uid)]
    [last] = [t for t in tasks if t.spec.operation == other and t.spec.node_name == edges[1]]
    # The Diagnosis's parameters are not copied into its Tasks: the hub reads them from the Diagnosis.
    assert last.spec.parameters == {
        f"{collect}.addr": f"addr-of-{edges[1]}",
        "task.name": last.metadata.name,
        "task.namespace": NS,
        "node": edges[1],
    }
    assert done.status.context is not None
    assert done.status.context.parameters == {"target": "10.0.0.1"}
    assert done.status.context.operations[other][last.metadata.name] == {"seen": f"addr-of-{edges[1]}"}
    assert done.status.checkpoint is not None
    assert (done.status.checkpoint.succeeded, done.status.checkpoint.failed) == (2, 0)
    told = await reasons(crds, diagnosis, until="DiagnosisSucceeded")
    # Event times have whole seconds, so only the multiset is certain.
    assert sorted(told) == sorted(
        ["DiagnosisRunning", "StagePassed", "OperationFailed", "StagePassed", "DiagnosisSucceeded"]
    )


async def test_a_silent_task_becomes_unknown_and_fails_its_stage(
    crds: ControlPlane, objects: Objects, admin_kube: Kube
) -> None:
    """A node that never answers has its Task Unknown after the operation's timeout; the stage fails, and with
    no other path the Diagnosis fails instead of waiting forever."""
    (probe,) = await objects.operations("probe", timeout_seconds=2)
    opset = await objects.operation_set([[1], []], [probe])
    edges = list(await objects.edges(2))
    diagnosis = await objects.diagnosis(opset.metadata.name, TargetSelector(node_names=tuple(edges)))

    async with hub(admin_kube, diagnosis, lambda t: (True, {}) if t.spec.node_name == edges[0] else None):
        done = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished, limit_s=30)
    assert done.status.phase is DiagnosisPhase.FAILED
    assert [ids(p) for p in done.status.failed_paths] == [[1]]
    complete = [c for c in done.status.conditions if c.type == "Complete"]
    assert [(c.status, c.reason) for c in complete] == [("False", "AllPathsFailed")]
    assert done.status.checkpoint is not None
    assert (done.status.checkpoint.succeeded, done.status.checkpoint.failed) == (1, 1)
    [silent] = [t for t in await tasks_of(admin_kube, diagnosis) if t.spec.node_name == edges[1]]
    assert silent.status.phase is TaskPhase.UNKNOWN
    assert [(c.type, c.reason) for c in silent.status.conditions] == [("Failed", "TimedOut")]
    assert "TaskTimedOut" in await reasons(crds, diagnosis, until="DiagnosisFailed")


async def test_a_restarted_controller_resumes_with_no_task_duplicated_or_counted_twice(
    crds: ControlPlane, controller_kube: Kube, admin_kube: Kube
) -> None:
    """A controller counts two of a stage's three Tasks and stops; the third ends while none runs; the next
    controller counts just that one (2 succeeded, 1 failed) and creates nothing again."""
    made = Objects(crds, admin_kube)
    try:
        await _restart_mid_diagnosis(made, controller_kube, admin_kube)
    finally:
        async with running(controller_kube):
            await made.cleanup()


async def _restart_mid_diagnosis(made: Objects, controller_kube: Kube, admin_kube: Kube) -> None:
    first, second = await made.operations("first", "second")
    opset = await made.operation_set([[1], [2], []], [first, second])
    edges = await made.edges(3)
    diagnosis = await made.diagnosis(opset.metadata.name, TargetSelector(node_names=tuple(edges)))
    name = diagnosis.metadata.name

    async with running(controller_kube):
        stage = await polled(functools.partial(tasks_of, admin_kube, diagnosis), lambda ts: len(ts) == 3)
        for task in stage:
            await answer_task(admin_kube, task, ok=True)
        everything = await polled(functools.partial(tasks_of, admin_kube, diagnosis), lambda ts: len(ts) == 6)
        later = [t for t in everything if t.spec.operation == second]
        by_node = {t.spec.node_name: t for t in later}
        for node in edges[:2]:
            await answer_task(admin_kube, by_node[node], ok=True)
        counted = await diagnosis_when(
            admin_kube, name, lambda d: d.status.checkpoint is not None and d.status.checkpoint.succeeded == 2
        )
    assert counted.status.checkpoint is not None
    assert (counted.status.checkpoint.path_index, counted.status.checkpoint.node_index) == (0, 1)
    before = {t.metadata.name: t.metadata.uid for t in await tasks_of(admin_kube, diagnosis)}

    await answer_task(admin_kube, by_node[edges[2]], ok=False)
    async with running(controller_kube):
        done = await diagnosis_when(admin_kube, name, finished)
    assert done.status.phase is DiagnosisPhase.FAILED
    cp = done.status.checkpoint
    assert cp is not None
    assert (cp.node_index, cp.desired, cp.succeeded, cp.failed, cp.active) == (1, 3, 2, 1, 0)
    assert cp.synchronized_tasks is msgspec.UNSET
    assert all(i in CountedNodes.decode(cp.synchronized_nodes, 3) for i in range(3))
    after = {t.metadata.name: t.metadata.uid for t in await tasks_of(admin_kube, diagnosis)}
    assert after == before
    assert len(after) == 6


async def test_an_operation_set_changed_mid_run_fails_the_diagnosis(
    objects: Objects, admin_kube: Kube, controller: DiagnosisController
) -> None:
    """Another graph under the OperationSet's name while a Diagnosis runs it: Failed with OperationSetChanged,
    and no Task of the new graph; the OperationSet itself gets its new paths and hash."""
    collect, extra = await objects.operations("collect", "extra")
    opset = await objects.operation_set([[1], []], [collect])
    diagnosis = await objects.diagnosis(opset.metadata.name, TargetSelector(node_names=await objects.edges(1)))
    first = await diagnosis_when(admin_kube, diagnosis.metadata.name, lambda d: HASH_LABEL in d.metadata.labels)
    await polled(functools.partial(tasks_of, admin_kube, diagnosis), bool)

    graph = [{"to": [1]}, {"operation": collect, "to": [2]}, {"operation": extra}]
    await admin_kube.merge_patch(OPERATION_SETS, opset.metadata.name, {"spec": {"adjacencyList": graph}})
    done = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
    assert done.status.phase is DiagnosisPhase.FAILED
    [changed] = [c for c in done.status.conditions if c.type == "OperationSetChanged"]
    assert (changed.status, changed.reason) == ("True", "OperationSetChanged")
    assert [t.spec.operation for t in await tasks_of(admin_kube, diagnosis)] == [collect]

    def repathed(s: OperationSet) -> bool:
        return (
            s.status.ready
            and len(s.status.paths[0]) == 2
            and s.metadata.labels.get(HASH_LABEL)
            not in (
                None,
                first.metadata.labels[HASH_LABEL],
            )
        )

    await polled(functools.partial(admin_kube.get, OPERATION_SETS, opset.metadata.name), repathed)


async def test_every_target_selector_resolves_to_its_nodes(
    objects: Objects, admin_kube: Kube, pods_allowed: None
) -> None:
    """Node selector, node names, pod selector (the pods' nodes, each Task carrying its pod) and pod references
    (a missing pod said in the Accepted condition) each run on their nodes; a selector matching nothing fails."""
    (probe,) = await objects.operations("probe")
    opset = await objects.operation_set([[1], []], [probe])
    zone, app = unique("zone"), unique("app")
    n1, n2, n3 = (unique("edge") for _ in range(3))
    await objects.nodes(n1, n2, zone=zone)
    await objects.nodes(n3)
    await objects.pod(f"{app}-0", node=n1, app=app)
    await objects.pod(f"{app}-1", node=n3, app=app)
    await objects.pod(f"{app}-2", app=app)

    cases = {
        "nodeSelector": (TargetSelector(node_selector=LabelSelector(match_labels={"zone": zone})), sorted([n1, n2])),
        "targetNodeNames": (TargetSelector(target_node_names=(n3, n1, n3)), [n3, n1]),
        "podSelector": (TargetSelector(pod_selector=LabelSelector(match_labels={"app": app})), [n1, n3]),
        "targetPodNames": (
            TargetSelector(
                target_pod_names=(
                    PodReference(namespace=NS, name=f"{app}-1", container="c"),
                    PodReference(namespace=NS, name=f"{app}-missing"),
                )
            ),
            [n3],
        ),
    }
    for kind, (targets, expected) in cases.items():
        diagnosis = await objects.diagnosis(opset.metadata.name, targets)
        tasks = await polled(
            functools.partial(tasks_of, admin_kube, diagnosis), functools.partial(_at_least, len(expected))
        )
        started = await admin_kube.get(DIAGNOSES, diagnosis.metadata.name, namespace=NS)
        assert list(started.status.node_names) == expected, kind
        assert sorted(t.spec.node_name for t in tasks) == sorted(expected), kind
        pods = {
            t.spec.node_name: (t.spec.parameters.get("pod.name"), t.spec.parameters.get("container")) for t in tasks
        }
        if kind == "podSelector":
            assert pods == {n1: (f"{app}-0", ""), n3: (f"{app}-1", "")}
            assert tasks[0].spec.pod_reference is not None
        elif kind == "targetPodNames":
            assert pods == {n3: (f"{app}-1", "c")}
            [accepted] = [c for c in started.status.conditions if c.type == "Accepted"]
            assert accepted.message == f"1 target node; left out: pod {NS}/{app}-missing does not exist"
        else:
            assert set(pods.values()) == {(None, None)}

    nothing = await objects.diagnosis(
        opset.metadata.name, TargetSelector(node_selector=LabelSelector(match_labels={"zone": unique("none")}))
    )
    failed = await diagnosis_when(admin_kube, nothing.metadata.name, finished)
    assert failed.status.phase is DiagnosisPhase.FAILED
    [accepted] = [c for c in failed.status.conditions if c.type == "Accepted"]
    assert (accepted.status, accepted.reason) == ("False", "NoTargets")
    assert "matched no node" in accepted.message
    assert await tasks_of(admin_kube, nothing) == []


async def test_made_up_and_cloud_node_names_get_no_task_and_the_status_names_them_briefly(
    objects: Objects, admin_kube: Kube
) -> None:
    """Two edge Nodes, a Node without the edge label and 150 made-up names: Tasks for the two only (not one per
    name, as before: each a copy in etcd and in every cache); the Accepted condition names the first ten left
    out, and how many more, in a message of bounded size."""
    (probe,) = await objects.operations("probe")
    opset = await objects.operation_set([[1], []], [probe])
    real = await objects.edges(2)
    cloud = unique("cloud")
    await objects.nodes(cloud, edge=False)
    made_up = tuple(f"{objects.prefix}-made-up-{i:03d}" for i in range(150))
    diagnosis = await objects.diagnosis(opset.metadata.name, TargetSelector(node_names=(*real, cloud, *made_up)))
    started = await diagnosis_when(admin_kube, diagnosis.metadata.name, lambda d: bool(d.status.node_names))
    assert started.status.node_names == real
    [accepted] = [c for c in started.status.conditions if c.type == "Accepted"]
    assert (accepted.status, accepted.reason) == ("True", "TargetsResolved")
    assert accepted.message.startswith(
        f"2 target nodes; left out: node {cloud} is not an edge node (label {EDGE_ROLE_LABEL});"
        f" node {made_up[0]} does not exist; node {made_up[1]} does not exist"
    )
    assert accepted.message.endswith("; and 141 more")
    assert len(accepted.message) < 2048
    tasks = await polled(functools.partial(tasks_of, admin_kube, diagnosis), functools.partial(_at_least, 2))
    assert sorted(t.spec.node_name for t in tasks) == sorted(real)


async def test_a_tasks_stored_size_does_not_grow_with_its_diagnosis_parameters(
    crds: ControlPlane, objects: Objects, admin_kube: Kube
) -> None:
    """60 KiB of parameters on a Diagnosis of 20 edge nodes: each of its 20 Tasks, as etcd stores it, stays
    under 8 KiB (it used to carry its own copy: 20 copies of 60 KiB a stage); the status keeps one copy."""
    (probe,) = await objects.operations("probe")
    opset = await objects.operation_set([[1], []], [probe])
    edges = await objects.edges(20)
    parameters = {"blob": "b" * (60 << 10)}
    diagnosis = await objects.diagnosis(opset.metadata.name, TargetSelector(node_names=edges), parameters=parameters)
    await polled(functools.partial(tasks_of, admin_kube, diagnosis), lambda ts: len(ts) == 20)
    selector = f"{DIAGNOSIS_UID_LABEL}={diagnosis.metadata.uid}"
    listed = await kubectl(crds, "get", "tasks", "-n", NS, "-l", selector, "-o", "json")
    sizes = [len(json.dumps(item, separators=(",", ":"))) for item in json.loads(listed.stdout)["items"]]
    assert len(sizes) == 20
    assert max(sizes) < 8 << 10, sizes
    started = await admin_kube.get(DIAGNOSES, diagnosis.metadata.name, namespace=NS)
    assert started.status.context is not None
    assert started.status.context.parameters == parameters


async def test_pod_references_to_another_namespace_are_not_read_and_get_no_task(
    objects: Objects, admin_kube: Kube, pods_allowed: None
) -> None:
    """A Diagnosis (stored while the webhook was away) referencing an existing pod of another namespace, and a
    missing one there: both are left out with the same reason, so it learns neither whether they exist nor
    their node; nothing else targeted, it fails with NoTargets and no Task."""
    (probe,) = await objects.operations("probe")
    opset = await objects.operation_set([[1], []], [probe])
    (edge,) = await objects.edges(1)
    secret = unique("secret-pod")
    await objects.pod(secret, node=edge, namespace=OTHER_NS)
    refs = (PodReference(namespace=OTHER_NS, name=secret), PodReference(namespace=OTHER_NS, name=unique("missing")))
    diagnosis = await objects.diagnosis(opset.metadata.name, TargetSelector(pod_references=refs))
    done = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
    assert done.status.phase is DiagnosisPhase.FAILED
    [accepted] = [c for c in done.status.conditions if c.type == "Accepted"]
    assert (accepted.status, accepted.reason) == ("False", "NoTargets")
    assert accepted.message == "no target node: " + "; ".join(
        f"pod {OTHER_NS}/{ref.name} is not in the Diagnosis's namespace {NS}" for ref in refs
    )
    assert await tasks_of(admin_kube, diagnosis) == []


async def test_a_diagnosis_with_parameters_over_64_kib_fails_saying_so_before_any_task(
    objects: Objects, admin_kube: Kube
) -> None:
    """100 KiB of parameters, stored while the webhook was away: Failed with ParametersTooLarge, no Task."""
    (probe,) = await objects.operations("probe")
    opset = await objects.operation_set([[1], []], [probe])
    parameters = {"blob": "b" * (100 << 10)}
    diagnosis = await objects.diagnosis(
        opset.metadata.name, TargetSelector(node_names=await objects.edges(1)), parameters=parameters
    )
    done = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
    assert done.status.phase is DiagnosisPhase.FAILED
    [complete] = [c for c in done.status.conditions if c.type == "Complete"]
    assert (complete.status, complete.reason) == ("False", "ParametersTooLarge")
    size = len(json.dumps(parameters, separators=(",", ":")))
    assert complete.message.startswith(f"spec.parameters take {size} bytes as JSON, more than the 65536")
    assert await tasks_of(admin_kube, diagnosis) == []


async def test_a_task_stays_while_its_diagnosis_exists_and_goes_with_it(
    crds: ControlPlane, objects: Objects, admin_kube: Kube
) -> None:
    """Deleting a Task of a live Diagnosis only marks it (the finalizer keeps it); deleting the Diagnosis
    removes all its Tasks, without a garbage collector."""
    (probe,) = await objects.operations("probe")
    opset = await objects.operation_set([[1], []], [probe])
    diagnosis = await objects.diagnosis(opset.metadata.name, TargetSelector(node_names=await objects.edges(2)))
    tasks = await polled(functools.partial(tasks_of, admin_kube, diagnosis), lambda ts: len(ts) == 2)
    await kubectl(crds, "delete", "task", "-n", NS, tasks[0].metadata.name, "--wait=false")
    kept = await admin_kube.get(TASKS, tasks[0].metadata.name, namespace=NS)
    assert kept.metadata.deletion_timestamp is not None
    assert kept.metadata.finalizers == (TASK_FINALIZER,)

    await admin_kube.delete(DIAGNOSES, diagnosis.metadata.name, namespace=NS)
    await polled(functools.partial(tasks_of, admin_kube, diagnosis), _empty)


async def test_a_finished_diagnosis_is_reaped_after_its_ttl_with_its_tasks(
    crds: ControlPlane, objects: Objects, admin_kube: Kube
) -> None:
    """ttlSecondsAfterFinished: 1 deletes the Diagnosis about a second after it succeeded (condition times have
    whole seconds), and its Tasks with it."""
    (probe,) = await objects.operations("probe")
    opset = await objects.operation_set([[1], []], [probe])
    diagnosis = await objects.diagnosis(
        opset.metadata.name, TargetSelector(node_names=await objects.edges(1)), ttl_seconds_after_finished=1
    )
    async with hub(admin_kube, diagnosis, lambda t: (True, {})):
        await polled(functools.partial(_exists, admin_kube, diagnosis), lambda there: not there)
    await polled(functools.partial(tasks_of, admin_kube, diagnosis), _empty)
    assert "DiagnosisSucceeded" in await reasons(crds, diagnosis, until="DiagnosisSucceeded")


async def test_operation_sets_get_their_paths_or_a_condition_naming_the_bad_node(
    objects: Objects, admin_kube: Kube, controller: DiagnosisController
) -> None:
    """A graph stored without the webhook that has an unreachable node is not ready, the condition naming the
    node; a valid one is ready with every path and its hash label. A Diagnosis of the bad one fails."""
    a, b = await objects.operations("a", "b")
    bad = await objects.operation_set([[1], [], []], [a, b])
    good = await objects.operation_set([[1, 2], [], []], [a, b])

    async def status(name: str, check: Callable[[OperationSet], bool]) -> OperationSet:
        return await polled(functools.partial(admin_kube.get, OPERATION_SETS, name), check)

    broken = await status(bad.metadata.name, lambda s: bool(s.status.conditions))
    assert (broken.status.ready, broken.status.paths) == (False, ())
    [ready] = broken.status.conditions
    assert (ready.status, ready.reason) == ("False", "InvalidGraph")
    assert ready.message == f"spec.adjacencyList[2]: node 2 ({b}) is not reachable from the start node 0"
    fine = await status(good.metadata.name, lambda s: s.status.ready and HASH_LABEL in s.metadata.labels)
    assert [ids(p) for p in fine.status.paths] == [[1], [2]]

    diagnosis = await objects.diagnosis(bad.metadata.name, TargetSelector(node_names=(unique("e"),)))
    failed = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
    [not_ready] = [c for c in failed.status.conditions if c.type == "OperationSetNotReady"]
    assert "is not reachable from the start node 0" in not_ready.message


async def test_a_diagnosis_created_before_its_operation_set_waits_for_it_and_runs(
    objects: Objects, admin_kube: Kube, controller: DiagnosisController
) -> None:
    """As ``kubectl apply`` of one file with the Diagnosis first creates them: the controller sees the Diagnosis
    with no OperationSet, waits instead of failing it, and runs it once the OperationSet is there."""
    (probe,) = await objects.operations("probe")
    name = f"{objects.prefix}-set-late"
    diagnosis = await objects.diagnosis(name, TargetSelector(node_names=await objects.edges(1)))
    await polled(lambda: _awaited(controller), bool)
    unstarted = await admin_kube.get(DIAGNOSES, diagnosis.metadata.name, namespace=NS)
    assert unstarted.status.phase is DiagnosisPhase.NONE
    nodes = (AdjacencyNode(to=(1,)), AdjacencyNode(operation=probe))
    late = OperationSet(metadata=ObjectMeta(name=name), spec=OperationSetSpec(adjacency_list=nodes))
    await admin_kube.create(OPERATION_SETS, late)
    objects.cluster_scoped.append((OPERATION_SETS, name))
    async with hub(admin_kube, diagnosis, lambda t: (True, {})):
        done = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
    assert done.status.phase is DiagnosisPhase.SUCCEEDED


async def _awaited(controller: DiagnosisController) -> int:
    return controller.sets_awaited


async def test_policy_any_passes_a_stage_one_node_passed(objects: Objects, admin_kube: Kube) -> None:
    """stagePolicy Any (KubeDiag's code): one of two nodes succeeding passes the stage."""
    (probe,) = await objects.operations("probe")
    opset = await objects.operation_set([[1], []], [probe])
    edges = await objects.edges(2)
    diagnosis = await objects.diagnosis(
        opset.metadata.name, TargetSelector(node_names=edges), stage_policy=StagePolicy.ANY
    )
    async with hub(admin_kube, diagnosis, lambda t: (t.spec.node_name == edges[0], {})):
        done = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
    assert done.status.phase is DiagnosisPhase.SUCCEEDED


async def test_tasks_ending_one_by_one_are_counted_in_the_write_that_decides_their_stage(
    crds: ControlPlane, controller_kube: Kube, admin_kube: Kube
) -> None:
    """With a long progress interval, a stage of three nodes whose Tasks end one at a time is written once
    when it is decided: each pass that found one more ended Task held its status back, and no version of the
    Diagnosis ever counted some of them but not all."""
    async with running(controller_kube, progress_interval=3600) as controller:
        made = Objects(crds, admin_kube)
        try:
            (one,) = await made.operations("one")
            operation_set = await made.operation_set([[1], []], [one])
            name = f"{made.prefix}-diag-0"
            async with recording(admin_kube, DIAGNOSES, name) as history:
                diagnosis = await made.diagnosis(
                    operation_set.metadata.name, TargetSelector(node_names=await made.edges(3))
                )
                tasks = await polled(
                    functools.partial(tasks_of, admin_kube, diagnosis), functools.partial(_at_least, 3)
                )

                async def held() -> int:
                    await anyio.lowlevel.checkpoint()
                    return controller.progress_held

                for answered, task in enumerate(tasks[:2], start=1):
                    await answer_task(admin_kube, task, ok=True)
                    # The controller has seen this Task end, and held back the status counting it.
                    await polled(held, functools.partial(operator.le, answered))
                await answer_task(admin_kube, tasks[2], ok=True)
                done = await diagnosis_when(admin_kube, name, finished)
            assert done.status.phase is DiagnosisPhase.SUCCEEDED
            counted = {
                (v.status.checkpoint.succeeded, v.status.checkpoint.active)
                for v in history.versions
                if v.status.checkpoint is not None
            }
            assert counted <= {(0, 3), (3, 0)}, counted
            assert controller.progress_held >= 2
        finally:
            await made.cleanup()


async def test_a_diagnosis_naming_more_nodes_than_it_may_fails_saying_so_before_any_task(
    objects: Objects, admin_kube: Kube
) -> None:
    """8,000 target names of 100 characters (800 KB), stored while the webhook was away: more than the 5,000 a
    Diagnosis may have, so it ends Failed with TooManyTargets saying so, and no Task is created. (Fewer names as
    long would still make too large a status: flows.diagnosis.size fails that run with StatusTooLarge.)"""
    (probe,) = await objects.operations("probe")
    opset = await objects.operation_set([[1], []], [probe])
    prefix = unique("edge")
    nodes = tuple(f"{prefix}-{i:05d}-" + "n" * (100 - len(prefix) - 7) for i in range(8000))
    diagnosis = await objects.diagnosis(opset.metadata.name, TargetSelector(node_names=nodes))
    done = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
    assert done.status.phase is DiagnosisPhase.FAILED
    [complete] = [c for c in done.status.conditions if c.type == "Complete"]
    assert (complete.status, complete.reason) == ("False", "TooManyTargets")
    assert complete.message == (
        "it lists 8000 node names, more than the 5000 a Diagnosis may have (the controller's diagnosisMaxTargets)"
    )
    assert done.status.node_names == ()
    assert await tasks_of(admin_kube, diagnosis) == []


async def test_an_operation_set_stored_without_the_webhook_gets_a_status_that_can_be_written(
    objects: Objects, admin_kube: Kube
) -> None:
    """Without the validating webhook, an OperationSet listing one edge 200,000 times (13 MB of problems, one
    per repeat, refused and retried forever) gets one problem saying how many times; one whose path would copy
    a node with an operation name of 800,000 characters (its status as large as its spec, together past etcd's
    limit) is refused for the paths' size. Both are not ready with a short condition, and a Diagnosis of the
    first fails saying why."""
    (a,) = await objects.operations("a")
    repeated = (AdjacencyNode(to=(1,) * 200_000), AdjacencyNode(operation=a))
    heavy = (AdjacencyNode(to=(1,)), AdjacencyNode(operation="x" * 800_000))
    names = []
    for nodes in (repeated, heavy):
        name = f"{objects.prefix}-set-{len(objects.cluster_scoped)}"
        obj = OperationSet(metadata=ObjectMeta(name=name), spec=OperationSetSpec(adjacency_list=nodes))
        await admin_kube.create(OPERATION_SETS, obj)
        objects.cluster_scoped.append((OPERATION_SETS, name))
        names.append(name)

    async def status(name: str) -> OperationSet:
        return await polled(
            functools.partial(admin_kube.get, OPERATION_SETS, name), lambda s: bool(s.status.conditions)
        )

    first, second = [await status(name) for name in names]
    [ready] = first.status.conditions
    assert (first.status.ready, ready.status, ready.reason) == (False, "False", "InvalidGraph")
    assert ready.message == "spec.adjacencyList[0].to[1]: node 0 lists node 1 200000 times"
    [ready] = second.status.conditions
    assert (second.status.ready, second.status.paths) == (False, ())
    assert ready.message.startswith("spec.adjacencyList: the paths would take ")
    assert len(ready.message) < 1024

    diagnosis = await objects.diagnosis(names[0], TargetSelector(node_names=(unique("e"),)))
    failed = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
    [not_ready] = [c for c in failed.status.conditions if c.type == "OperationSetNotReady"]
    assert not_ready.message.endswith("node 0 lists node 1 200000 times")


class Refusing:
    """The controller's client, but a status write whose status takes more than ``limit`` bytes of JSON is
    refused as etcd refuses an object over its limit: what a status the controller's own bounds let through
    would meet (their estimate wrong, or an etcd of a smaller limit)."""

    def __init__(self, kube: Kube, limit: int) -> None:
        self._kube = kube
        self._limit = limit
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    async def update_status(self, resource: Any, name: str, mutate: Callable[[Any], Any], **options: Any) -> Any:
        def bounded(obj: Any) -> Any:
            changed = mutate(obj)
            if changed is not None and len(msgspec.json.encode(changed.status)) > self._limit:
                self.refused += 1
                raise ApiError(500, "InternalError", "etcdserver: request is too large")
            return changed

        return await self._kube.update_status(resource, name, bounded, **options)


async def test_a_status_the_api_server_refuses_for_its_size_ends_the_run_and_the_graph_saying_so(
    crds: ControlPlane, controller_kube: Kube, admin_kube: Kube
) -> None:
    """Statuses refused as too large (here, over 4 KiB) although the controller's bounds let them through: the
    Diagnosis of 150 nodes ends Failed with StatusTooLarge in a status without its node names, and the
    OperationSet whose path copies a node of 3,000 dependences is not ready with StatusTooLarge, instead of
    either write being refused and retried forever."""
    refusing = Refusing(controller_kube, 4096)
    made = Objects(crds, admin_kube)
    try:
        async with running(cast("Kube", refusing)):
            (probe,) = await made.operations("probe")
            small = await made.operation_set([[1], []], [probe])
            heavy = (AdjacencyNode(to=(1,)), AdjacencyNode(operation=probe, dependences=(1,) * 3000))
            name = f"{made.prefix}-set-heavy"
            await admin_kube.create(
                OPERATION_SETS, OperationSet(metadata=ObjectMeta(name=name), spec=OperationSetSpec(heavy))
            )
            made.cluster_scoped.append((OPERATION_SETS, name))
            nodes = await made.edges(150, length=40)
            diagnosis = await made.diagnosis(small.metadata.name, TargetSelector(node_names=nodes))

            done = await diagnosis_when(admin_kube, diagnosis.metadata.name, finished)
            refused = await polled(
                functools.partial(admin_kube.get, OPERATION_SETS, name),
                lambda s: bool(s.status.conditions) and HASH_LABEL in s.metadata.labels,
            )
            assert done.status.phase is DiagnosisPhase.FAILED
            [complete] = [c for c in done.status.conditions if c.type == "Complete"]
            assert (complete.reason, complete.message) == (
                "StatusTooLarge",
                "the API server refused to store its status: etcdserver: request is too large",
            )
            assert done.status.node_names == ()
            assert (refused.status.ready, refused.status.paths) == (False, ())
            [ready] = refused.status.conditions
            assert (ready.status, ready.reason) == ("False", "StatusTooLarge")
            assert refusing.refused >= 2
    finally:
        async with running(controller_kube):
            await made.cleanup()


def _ctl(cp: ControlPlane, *args: str) -> list[str]:
    return [sys.executable, "-m", "roles.cli", "ctl", *args, f"--kubeconfig={cp.kubeconfig('admin')}"]


async def test_ctl_follows_a_diagnosis_to_its_end_and_describes_its_paths_and_failed_nodes(
    crds: ControlPlane, objects: Objects, admin_kube: Kube
) -> None:
    """`ctl watch diagnosis/NAME` prints a line per change and exits 0 on Succeeded; `ctl describe` then shows the
    failed path, the one that succeeded and the failed node's reason; `ctl get diagnosis` finds it by namespace."""
    collect, check, other = await objects.operations("collect", "check", "other")
    opset = await objects.operation_set([[1], [2, 3], [], []], [collect, check, other])
    edges = list(await objects.edges(2))
    diagnosis = await objects.diagnosis(opset.metadata.name, TargetSelector(node_names=tuple(edges)))
    name = diagnosis.metadata.name

    def decide(task: Task) -> Verdict:
        return (task.spec.operation != check or task.spec.node_name == edges[0]), {}

    watch = await anyio.open_process(
        _ctl(crds, "watch", f"diagnosis/{name}", "-n", NS, "-o", "json"), stdout=subprocess.PIPE
    )
    output = b""
    try:
        assert watch.stdout is not None
        with anyio.fail_after(120):
            while b"\n" not in output:  # the watch has found the Diagnosis before anything moves
                output += await watch.stdout.receive()
            async with hub(admin_kube, diagnosis, decide):
                with contextlib.suppress(anyio.EndOfStream):
                    while True:
                        output += await watch.stdout.receive()
                status = await watch.wait()
    finally:
        await terminate(watch)
    lines = [json.loads(line) for line in output.decode().splitlines()]
    assert status == 0
    phases = [line["diagnosis"]["phase"] for line in lines if "diagnosis" in line]
    assert phases[-1] == "Succeeded"
    assert "Running" in phases
    assert any(line["diagnosis"].get("path") == 2 for line in lines if "diagnosis" in line)  # the fallback ran

    described = await anyio.run_process(_ctl(crds, "describe", f"diag/{name}", "-o", "json"))
    document = json.loads(described.stdout)
    assert [(p["operations"], p["outcome"]) for p in document["paths"]] == [
        ([collect, check], "Failed"),
        ([collect, other], "Succeeded"),
    ]
    assert [(t["target"], t["operation"], t["reason"]) for t in document["failedTasks"]] == [
        (edges[1], check, "Test: by the test")
    ]
    assert document["tasks"]["Succeeded"] == 5
    text = (await anyio.run_process(_ctl(crds, "describe", f"diagnosis/{name}", f"--namespace={NS}"))).stdout.decode()
    assert f"Name:          {name}" in text
    assert "Phase:         Succeeded" in text

    everywhere = await anyio.run_process(_ctl(crds, "get", "diagnoses", "-A", "--no-headers"))
    assert [NS, name, "Succeeded"] in [line.split()[:3] for line in everywhere.stdout.decode().splitlines()]
    # -n before the command, as kubectl takes it
    elsewhere = await anyio.run_process(
        [sys.executable, "-m", "roles.cli", "-n", OTHER_NS, *_ctl(crds, "get", "diagnosis")[3:]]
    )
    assert (elsewhere.stdout, elsewhere.stderr) == (b"", f"no Diagnoses in namespace {OTHER_NS}\n".encode())
    listed = json.loads((await anyio.run_process(_ctl(crds, "get", "diagnosis", "-o", "json"))).stdout)
    assert name in [item["metadata"]["name"] for item in listed["items"]]
    missing = await anyio.run_process(_ctl(crds, "describe", "diagnosis/none-such", "-n", OTHER_NS), check=False)
    assert missing.returncode == 2
    assert f"no Diagnosis 'none-such' in namespace '{OTHER_NS}'" in missing.stderr.decode()
