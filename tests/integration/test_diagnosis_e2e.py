"""Diagnoses end to end: the controller, a hub and two edge agents as real processes on the real API server.

Most Operations are ``httpServer`` processors posting to an HTTP server in the test (on loopback,
which a device may always reach), which records each request and answers as the test says: that is
what proves a value went from one stage's results into the next stage's request, and that a stage
a later path shares ran once on each node. A ``scriptRunner`` Operation shows the device's own
config deciding whether a script runs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from flows.diagnosis.tasks import DIAGNOSIS_UID_LABEL
from nodetask.phases import ConditionStatus
from roles.kube import Kube, NotFound
from roles.kube.resources import DIAGNOSES, NODES, OPERATION_SETS, OPERATIONS, TASKS
from schemas.core import HUB_ANNOTATION
from schemas.diagnosis.v1 import (
    AdjacencyNode,
    Diagnosis,
    DiagnosisPhase,
    DiagnosisSpec,
    Operation,
    OperationSet,
    OperationSetSpec,
    OperationSpec,
    StagePolicy,
    TargetSelector,
    Task,
    TaskPhase,
)
from schemas.meta import ObjectMeta
from schemas.processors import HTTPServer, Processor, ScriptRunner
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin
from tests.integration.objects import diagnosis_when, finished, polled, tasks_of, unique
from tests.integration.processes import Fleet, fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow(90)]
NS = "default"

Answer = tuple[int, dict[str, str] | str]
"""An HTTP status and a JSON object of strings (or a text body)."""


@dataclass
class Seen:
    path: str
    body: dict[str, str]

    @property
    def node(self) -> str:
        return self.body.get("node", "")


@dataclass
class Processors:
    """The HTTP server every Operation posts to: records each request, answers with ``answer(path, body)``."""

    answer: Callable[[str, dict[str, str]], Answer]
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    """Set to let requests that ``answer`` holds (see :meth:`hold`) go on."""
    port: int = 0

    def requests(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    def hold(self) -> None:
        """Called by ``answer``: keep this request waiting until :attr:`release` (a node busy on it)."""
        self.release.wait(timeout=120)

    @contextlib.contextmanager
    def serving(self) -> Iterator[Processors]:
        processors = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                processors.seen.append(Seen(self.path, body))
                status, reply = processors.answer(self.path, body)
                data = (json.dumps(reply) if isinstance(reply, dict) else reply).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = _QuietServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, name="processors")
        thread.start()
        try:
            yield self
        finally:
            self.release.set()
            server.shutdown()
            server.server_close()
            thread.join()

    def operation(self, name: str, path: str, *, timeout_seconds: int = 30) -> Operation:
        server = HTTPServer(address="127.0.0.1", port=self.port, path=path)
        processor = Processor(http_server=server, timeout_seconds=timeout_seconds)
        return Operation(metadata=ObjectMeta(name=name), spec=OperationSpec(processor=processor))


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a held request whose agent was killed meanwhile: nobody reads the answer


@dataclass
class Scene:
    """A running fleet (controller, one hub, two agents), the processors' server, and the objects made."""

    cp: ControlPlane
    kube: Kube
    fleet: Fleet
    processors: Processors
    nodes: list[str]
    prefix: str = field(default_factory=lambda: unique("e2e"))
    cluster_scoped: list[tuple[Any, str]] = field(default_factory=list)
    diagnoses: list[Diagnosis] = field(default_factory=list)

    async def operations(self, paths: Sequence[str], *, timeout_seconds: int = 30) -> list[str]:
        """One Operation posting to each path; their names."""
        names = []
        for path in paths:
            name = f"{self.prefix}-{path.strip('/')}"
            await self.kube.create(OPERATIONS, self.processors.operation(name, path, timeout_seconds=timeout_seconds))
            self.cluster_scoped.append((OPERATIONS, name))
            names.append(name)
        return names

    async def diagnosis(self, successors: list[list[int]], operations: Sequence[str], **spec: Any) -> Diagnosis:
        """A Diagnosis of both nodes through the graph where node ``i`` leads to ``successors[i]``."""
        nodes = tuple(
            AdjacencyNode(to=tuple(to), operation=operations[i - 1] if i else "") for i, to in enumerate(successors)
        )
        name = f"{self.prefix}-set"
        await self.kube.create(
            OPERATION_SETS, OperationSet(metadata=ObjectMeta(name=name), spec=OperationSetSpec(adjacency_list=nodes))
        )
        self.cluster_scoped.append((OPERATION_SETS, name))
        targets = TargetSelector(node_names=tuple(self.nodes))
        obj = Diagnosis(
            metadata=ObjectMeta(name=f"{self.prefix}-diag", namespace=NS),
            spec=DiagnosisSpec(operation_set=name, target_selector=targets, **spec),
        )
        created = await self.kube.create(DIAGNOSES, obj, namespace=NS)
        self.diagnoses.append(created)
        return created

    async def delete_diagnosis(self, diagnosis: Diagnosis) -> None:
        """Delete it, and wait until the controller has removed its Tasks."""
        with contextlib.suppress(NotFound):
            await self.kube.delete(DIAGNOSES, diagnosis.metadata.name, namespace=NS)
        selector = f"{DIAGNOSIS_UID_LABEL}={diagnosis.metadata.uid}"

        async def left() -> list[Task]:
            found, _, _ = await self.kube.list(TASKS, label_selector=selector, namespace=NS)
            return found

        await polled(left, lambda found: not found, limit_s=60)


async def _connected(kube: Kube, nodes: Sequence[str]) -> bool:
    for node in nodes:
        found = await kube.get(NODES, node)
        if HUB_ANNOTATION not in found.metadata.annotations:
            return False
    return True


@asynccontextmanager
async def scene(
    cp: ControlPlane,
    home: Path,
    processors: Processors,
    *,
    edge_options: Callable[[int], dict[str, object]] | None = None,
) -> AsyncIterator[Scene]:
    """Start everything (agent ``i``'s config with ``edge_options(i)``, its ``diagnosis.loopbackPorts`` listing the
    processors' server), wait until both agents hold a session; at the end delete what was made (the Diagnoses
    first, while the controller can still release their Tasks), then check that every process not killed on
    purpose exited cleanly."""

    def options(index: int) -> dict[str, object]:
        given = edge_options(index) if edge_options else {}
        diagnosis = given.get("diagnosis", {})
        assert isinstance(diagnosis, dict)
        return {**given, "diagnosis": {**diagnosis, "loopbackPorts": [processors.port]}}

    with processors.serving():
        async with admin(cp) as kube, fleet(cp, home, edges=2, hubs=1, edge_options=options) as running:
            nodes = sorted(running.edges)
            await polled(functools.partial(_connected, kube, nodes), bool, limit_s=60)
            made = Scene(cp, kube, running, processors, nodes)
            try:
                yield made
            finally:
                with anyio.CancelScope(shield=True):
                    for diagnosis in made.diagnoses:
                        await made.delete_diagnosis(diagnosis)
                    for resource, name in made.cluster_scoped:
                        with contextlib.suppress(NotFound):
                            await kube.delete(resource, name)
    assert all(code == 0 for p, code in running.exits.items() if not running.named(p).killed), running.exits


def _by(tasks: list[Task], operation: str, node: str) -> Task:
    (found,) = [t for t in tasks if t.spec.operation == operation and t.spec.node_name == node]
    return found


def _conditions(task: Task) -> list[tuple[str, str]]:
    return [(c.type, c.reason) for c in task.status.conditions if c.status is ConditionStatus.TRUE]


async def test_a_failed_path_falls_back_carrying_results_forward_without_running_the_shared_stage_again(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """Path [collect, probe] fails because probe answers 500 on one node; path [collect, report] then runs report
    only (collect is shared, and each node posted to it once), each report request holding its own node's
    collect result and the Diagnosis's parameters (60 KiB of them), which the hub read from the Diagnosis: no
    Task carries them; the Tasks show Accepted then Complete or Failed; deleting the Diagnosis removes its
    Tasks."""
    failing: list[str] = []

    def answer(path: str, body: dict[str, str]) -> Answer:
        node = body["node"]
        if path == "/collect":
            return 200, {"token": f"tok-{node}"}
        if path == "/probe":
            return (500, "disk /var is 97% full") if node in failing else (200, {"ok": "yes"})
        return 200, {"seen": next((v for k, v in body.items() if k.endswith(".token")), "")}

    async with scene(crds, tmp_path, Processors(answer)) as s:
        failing.append(s.nodes[0])
        collect, probe, report = await s.operations(["/collect", "/probe", "/report"])
        parameters = {"target": "x", "blob": "b" * (60 << 10)}
        diagnosis = await s.diagnosis([[1], [2, 3], [], []], [collect, probe, report], parameters=parameters)
        done = await diagnosis_when(s.kube, diagnosis.metadata.name, finished, limit_s=90)

        assert done.status.phase is DiagnosisPhase.SUCCEEDED
        assert [[n.id for n in p] for p in done.status.failed_paths] == [[1, 2]]
        assert [n.id for n in done.status.succeeded_path] == [1, 3]
        for path in ("/collect", "/probe", "/report"):
            assert sorted(r.node for r in s.processors.requests(path)) == s.nodes, path
        tasks = await tasks_of(s.kube, diagnosis)
        for node in s.nodes:
            (sent,) = [r for r in s.processors.requests("/report") if r.node == node]
            reported = _by(tasks, report, node)
            assert sent.body[f"{collect}.token"] == f"tok-{node}"
            assert sent.body["task.uid"] == reported.metadata.uid
            assert (sent.body["target"], sent.body["task.name"]) == ("x", reported.metadata.name)
            assert sent.body["blob"] == parameters["blob"]
            assert not set(parameters) & set(reported.spec.parameters)
            assert reported.status.results == {"seen": f"tok-{node}"}
            assert _conditions(reported) == [("Accepted", "TaskStored"), ("Complete", "TaskSucceeded")]
            assert reported.status.start_time
        bad = _by(tasks, probe, s.nodes[0])
        assert bad.status.phase is TaskPhase.FAILED
        assert _conditions(bad) == [("Accepted", "TaskStored"), ("Failed", "ProcessorFailed")]
        assert "500" in bad.status.conditions[-1].message
        assert "disk /var is 97% full" in bad.status.conditions[-1].message
        assert _by(tasks, probe, s.nodes[1]).status.phase is TaskPhase.SUCCEEDED
        assert done.status.context is not None
        assert done.status.context.operations[report] == {
            _by(tasks, report, node).metadata.name: {"seen": f"tok-{node}"} for node in s.nodes
        }

        await s.delete_diagnosis(diagnosis)


async def test_a_stage_whose_node_is_killed_mid_task_ends_unknown_and_its_late_result_changes_nothing(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """One agent is SIGKILLed while its request is in flight: its Task (Accepted) becomes Unknown after the
    operation's timeout, the stage and the Diagnosis fail instead of waiting; restarted, the agent runs the
    stored Task again and reports, and the hub acknowledges that result without writing it."""
    held: list[str] = []

    def answer(path: str, body: dict[str, str]) -> Answer:
        if body["node"] in held:
            processors.hold()
        return 200, {"checked": body["node"]}

    processors = Processors(answer)
    async with scene(crds, tmp_path, processors) as s:
        victim, other = s.nodes
        held.append(victim)
        (check,) = await s.operations(["/check"], timeout_seconds=5)
        diagnosis = await s.diagnosis([[1], []], [check])

        def victim_asked(seen: list[Seen]) -> bool:
            return any(r.node == victim for r in seen)

        await polled(functools.partial(_snapshot, s.processors), victim_asked, limit_s=60)
        await s.fleet.edges[victim].kill()
        done = await diagnosis_when(s.kube, diagnosis.metadata.name, finished, limit_s=60)

        assert done.status.phase is DiagnosisPhase.FAILED
        assert [[n.id for n in p] for p in done.status.failed_paths] == [[1]]
        assert done.status.checkpoint is not None
        assert (done.status.checkpoint.succeeded, done.status.checkpoint.failed) == (1, 1)
        tasks = await tasks_of(s.kube, diagnosis)
        lost = _by(tasks, check, victim)
        assert lost.status.phase is TaskPhase.UNKNOWN
        assert _conditions(lost) == [("Accepted", "TaskStored"), ("Failed", "TimedOut")]
        assert _by(tasks, check, other).status.phase is TaskPhase.SUCCEEDED

        s.processors.release.set()
        await s.fleet.edges[victim].start()
        hub_log = tmp_path / "hub-0.log"

        def ignored(text: str) -> bool:
            return "late_task_result_ignored" in text and lost.metadata.uid in text

        await polled(functools.partial(anyio.Path(hub_log).read_text), ignored, limit_s=60)
        assert len([r for r in s.processors.requests("/check") if r.node == victim]) == 2
        again = await s.kube.get(TASKS, lost.metadata.name, namespace=NS)
        assert again.status == lost.status


async def _snapshot(processors: Processors) -> list[Seen]:
    await anyio.lowlevel.checkpoint()
    return list(processors.seen)


SCRIPT = '#!/bin/sh\nprintf \'%s is 42%% full on %s\\n\' "$1" "$2"\n'
"""Prints its two arguments (``argKeys``: a Diagnosis parameter and the node), as a disk check would."""


def _scripts_allowed(index: int) -> dict[str, object]:
    """Agent 1 enables scripts and lists SCRIPT's digest; agent 0 keeps the default (scripts off)."""
    if index != 1:
        return {}
    digest = hashlib.sha256(SCRIPT.encode()).hexdigest()
    return {"diagnosis": {"scripts": {"enabled": True, "allowedSha256": [digest]}}}


async def test_a_script_runs_only_where_the_device_allows_it_and_its_output_reaches_the_diagnosis(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """A scriptRunner Operation on two agents: the one with the default config refuses it (the Task Failed, its
    reason naming diagnosis.scripts.enabled); the one whose config enables scripts and lists the script's
    SHA-256 runs it with its argKeys as arguments, and its stdout is the Task's result and in the context."""
    processors = Processors(lambda path, body: (404, "no HTTP processor in this test"))
    async with scene(crds, tmp_path, processors, edge_options=_scripts_allowed) as s:
        refusing, allowing = list(s.fleet.edges)
        name = f"{s.prefix}-disk"
        runner = ScriptRunner(script=SCRIPT, arg_keys=("mount", "node"), operation_result_key="disk")
        operation = Operation(
            metadata=ObjectMeta(name=name), spec=OperationSpec(processor=Processor(script_runner=runner))
        )
        await s.kube.create(OPERATIONS, operation)
        s.cluster_scoped.append((OPERATIONS, name))
        diagnosis = await s.diagnosis([[1], []], [name], parameters={"mount": "/var"}, stage_policy=StagePolicy.ANY)
        done = await diagnosis_when(s.kube, diagnosis.metadata.name, finished, limit_s=90)

        assert done.status.phase is DiagnosisPhase.SUCCEEDED
        tasks = await tasks_of(s.kube, diagnosis)
        refused = _by(tasks, name, refusing)
        assert refused.status.phase is TaskPhase.FAILED
        assert _conditions(refused) == [("Accepted", "TaskStored"), ("Failed", "ProcessorFailed")]
        assert "diagnosis.scripts.enabled" in refused.status.conditions[-1].message
        assert refused.status.results == {}
        ran = _by(tasks, name, allowing)
        output = {"operation.disk.output": f"/var is 42% full on {allowing}\n"}
        assert ran.status.phase is TaskPhase.SUCCEEDED
        assert ran.status.results == output
        assert done.status.context is not None
        assert done.status.context.operations == {name: {ran.metadata.name: output}}
