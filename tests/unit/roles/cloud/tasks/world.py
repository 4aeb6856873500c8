"""What the hub's diagnosis Task tests share: Tasks and Operations in an in-memory API server, an edge connected
to a running hub, and the reports it sends."""

from __future__ import annotations

import trio.testing

from flows.diagnosis.job import RUN
from nodetask.messages import Error, Report, ReportAck, RunAction
from roles.kube.resources import OPERATIONS, TASKS
from schemas.diagnosis.v1 import (
    Operation,
    OperationSpec,
    Task,
    TaskPhase,
    TaskSpec,
    TaskStatus,
)
from schemas.meta import ObjectMeta
from schemas.processors import HTTPServer, Processor
from tests.unit.roles.cloud.doubles import FakeEdge, MemoryApi, MemoryDoor, edge_nodes

NS = "ns"
PROCESSOR = Processor(http_server=HTTPServer(address="127.0.0.1", port=9, path="/check"), timeout_seconds=5)


def operation(name: str = "check") -> Operation:
    return Operation(metadata=ObjectMeta(name=name), spec=OperationSpec(processor=PROCESSOR))


def task(name: str = "t", *, node: str = "n0", op: str = "check", phase: TaskPhase = TaskPhase.NONE) -> Task:
    return Task(
        metadata=ObjectMeta(name=name, namespace=NS, uid=f"uid-{name}"),
        spec=TaskSpec(operation=op, node_name=node, parameters={"target": "10.0.0.1"}),
        status=TaskStatus(phase=phase),
    )


def world(*tasks: Task, operations: tuple[str, ...] = ("check",), api: MemoryApi | None = None) -> MemoryApi:
    """An API server with nodes n0 and n1, the Operations and the Tasks."""
    api = api or MemoryApi()
    edge_nodes(api, "n0", "n1")
    for name in operations:
        api.put(OPERATIONS, operation(name))
    for t in tasks:
        api.put(TASKS, t)
    return api


def stored(api: MemoryApi, name: str = "t") -> Task:
    return api.peek(TASKS, name, NS)


def conditions(t: Task) -> list[tuple[str, str, str]]:
    return [(c.type, c.status, c.reason) for c in t.status.conditions]


def result(run: RunAction, *, seq: int = 1, succ: bool = True, extend: str = "", reason: str = "") -> Report:
    return Report(route=run.route, job_uid=run.job_uid, seq=seq, action=RUN, succ=succ, extend=extend, reason=reason)


async def connected(door: MemoryDoor, node: str = "n0") -> FakeEdge:
    edge = door.connect(node)
    await edge.hello()
    return edge


async def answer_to(edge: FakeEdge) -> ReportAck | Error:
    """The hub's next answer to a report; a RunAction on the way (the Task was just found) is skipped."""
    while True:
        msg = await edge.receive()
        if isinstance(msg, ReportAck | Error):
            return msg


async def quiet() -> None:
    """Every task of the hub (writers included) has nothing left to do."""
    await trio.testing.wait_all_tasks_blocked()
