"""What Diagnoses can make one device hold, with a real agent process, a hub and the API server.

Tasks are created straight on the API server (as the controller creates them for a Diagnosis, one per
stage and node), so that forty of them are open on one node at once, as forty Diagnoses would make
them; the hub sends each to the agent as it does any Task. Their ``httpServer`` processors post to a
server in the test, on loopback, which answers as slowly and as largely as a Task's answer may be.
"""

from __future__ import annotations

import contextlib
import http.server
import sqlite3
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import msgspec
import pytest

from roles.edge.processors.http import MAX_BODY_BYTES
from roles.edge.role import STORE_FILE
from roles.kube import Kube, NotFound
from roles.kube.resources import OPERATIONS, TASKS
from schemas.diagnosis.v1 import Operation, OperationSpec, Task, TaskPhase, TaskSpec
from schemas.meta import ObjectMeta
from schemas.processors import HTTPServer, Processor
from tests.integration.agents import agent_command, write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import eventually, running_hub
from tests.integration.objects import polled, unique
from tools.processes import terminate

pytestmark = pytest.mark.integration
NS: Final = "default"
MIB: Final = 1 << 20
ANSWER: Final = msgspec.json.encode({"blob": "x" * (MAX_BODY_BYTES - 11)})
"""A 200's body as large as the ``httpServer`` processor takes (2 MiB): one value, which it clips to 64 KiB."""
CHUNK_S: Final = 0.15
"""Between two 128 KiB parts of an answer: slow enough that forty Tasks made at once would all be answered
together, were nothing to stop them."""


@dataclass
class SlowServer:
    """Answers every POST with :data:`ANSWER`, 128 KiB every :data:`CHUNK_S` (2.4 s each); counts the requests
    it is answering at once (never more than the agent is waiting for)."""

    port: int = 0
    in_flight: int = 0
    peak: int = 0
    answered: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def serving(self) -> Iterator[SlowServer]:
        server_state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                with server_state.lock:
                    server_state.in_flight += 1
                    server_state.peak = max(server_state.peak, server_state.in_flight)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(ANSWER)))
                self.end_headers()
                chunks = [ANSWER[start : start + (128 << 10)] for start in range(0, len(ANSWER), 128 << 10)]
                for chunk in chunks[:-1]:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    time.sleep(CHUNK_S)
                # Counted out before its end is sent: until then the agent's turn is surely still taken.
                with server_state.lock:
                    server_state.in_flight -= 1
                    server_state.answered += 1
                self.wfile.write(chunks[-1])

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = _QuietServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, name="slow-answers")
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # an agent stopped mid-answer: nobody reads the rest


@dataclass
class Device:
    """One agent process, its node, and the admin client that makes its Tasks."""

    node: str
    process: anyio.abc.Process
    data_dir: Path
    kube: Kube
    made: list[tuple[Any, str, str | None]] = field(default_factory=list)

    def memory_kib(self, key: str) -> int:
        """``VmRSS`` (now) or ``VmHWM`` (the peak since it started) of the agent, in KiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
        raise AssertionError(f"no {key} in /proc/{self.process.pid}/status")

    def store_bytes(self) -> int:
        """Bytes in use in the agent's store (what its quota counts), read beside the agent."""
        with contextlib.closing(sqlite3.connect(self.data_dir / STORE_FILE, timeout=10)) as conn:
            pages, free, size = (
                conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size")
            )
        return int((pages - free) * size)

    async def operation(self, port: int) -> str:
        name = unique("slow")
        server = HTTPServer(address="127.0.0.1", port=port, path="/answer")
        spec = OperationSpec(processor=Processor(http_server=server, timeout_seconds=300))
        await self.kube.create(OPERATIONS, Operation(metadata=ObjectMeta(name=name), spec=spec))
        self.made.append((OPERATIONS, name, None))
        return name

    async def tasks(self, operation: str, count: int, parameters: dict[str, str]) -> list[str]:
        """Create ``count`` Tasks at once (as many Diagnoses started together would); their names."""
        names = [unique("task") for _ in range(count)]
        spec = TaskSpec(operation=operation, node_name=self.node, parameters=parameters)

        async def create(name: str) -> None:
            await self.kube.create(TASKS, Task(metadata=ObjectMeta(name=name, namespace=NS), spec=spec), namespace=NS)

        self.made.extend((TASKS, name, NS) for name in names)
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(create, name)
        return names

    async def ended(self, names: list[str], *, limit_s: float) -> list[Task]:
        """The Tasks once each has ended."""

        async def fetch() -> list[Task]:
            return [await self.kube.get(TASKS, name, namespace=NS) for name in names]

        final = (TaskPhase.SUCCEEDED, TaskPhase.FAILED, TaskPhase.UNKNOWN)
        return await polled(fetch, lambda tasks: all(t.status.phase in final for t in tasks), limit_s=limit_s)


@asynccontextmanager
async def device(cp: ControlPlane, home: Path, *, loopback_port: int) -> AsyncIterator[Device]:
    """A hub in this process and one agent process connected to it (its config with the default limits,
    ``diagnosis.loopbackPorts`` listing ``loopback_port``); at the end, what was made is deleted and the
    agent must exit cleanly."""
    node = unique("limits")
    tokens = await register_edges(cp, [node])
    async with admin(cp) as kube, running_hub(cp, unique("hub")) as hub:
        config = write_agent_config(
            home, node=node, token=tokens[node], hub_urls=[hub.url], diagnosis={"loopbackPorts": [loopback_port]}
        )
        with (home / "agent.log").open("ab") as log:
            process = await anyio.open_process(agent_command(config), stdout=log, stderr=subprocess.STDOUT)
        made = Device(node, process, home / "data", kube)
        try:
            await eventually(lambda: node in hub.hub.sessions, limit_s=180)
            yield made
        finally:
            with anyio.CancelScope(shield=True):
                code = await terminate(process)
                for resource, name, namespace in reversed(made.made):
                    with contextlib.suppress(NotFound):
                        await kube.delete(resource, name, namespace=namespace)
    assert code == 0, (home / "agent.log").read_text()[-3000:]


async def test_forty_slow_two_mib_answers_at_once_keep_the_agent_within_its_turns_of_memory(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """40 Tasks made at once on one node, each posting to a server that answers 2 MiB over 2.4 s: at most
    ``diagnosis.maxConcurrentTasks`` (4) requests are ever in flight, all 40 succeed, and the agent's peak
    resident memory stays within 24 MiB of its idle size.

    The bound: an answer in flight costs the agent about 3 MiB (its 2 MiB body, then the results decoded
    from it before they are clipped to 64 KiB; four at once measured +12.5 MiB in one process), so 4 turns
    take about 13 MiB; the HTTP client and the processors, loaded by the first Task, and the allocator's
    slack take the rest (measured: 44 MiB idle, 61 MiB at peak). Without turns the 40 answers were all
    in flight at once and took the agent to 113 MiB."""
    with SlowServer().serving() as server:
        async with device(crds, tmp_path, loopback_port=server.port) as edge:
            operation = await edge.operation(server.port)
            idle = edge.memory_kib("VmRSS")
            names = await edge.tasks(operation, 40, {"check": "disk"})
            tasks = await edge.ended(names, limit_s=600)
            peak = edge.memory_kib("VmHWM")
    assert [t.status.phase for t in tasks] == [TaskPhase.SUCCEEDED] * 40, [t.status.conditions for t in tasks]
    assert server.answered == 40
    assert server.peak <= 4
    assert peak - idle <= 24 * 1024, (idle, peak)


async def test_tasks_with_600_kib_of_request_data_fail_naming_the_setting_and_leave_the_store_as_it_was(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """Ten Tasks with 600 KiB of parameters (the hub sends up to 768 KiB) each fail at once, their reason naming
    ``diagnosis.maxRequestBytes``, and the agent's store grows by less than 256 KiB, not 6 MB; a Task within
    the limit still runs."""
    with SlowServer().serving() as server:
        async with device(crds, tmp_path, loopback_port=server.port) as edge:
            operation = await edge.operation(server.port)
            before = edge.store_bytes()
            names = await edge.tasks(operation, 10, {"blob": "x" * (600 << 10)})
            refused = await edge.ended(names, limit_s=120)
            grown = edge.store_bytes() - before
            (small,) = await edge.ended(await edge.tasks(operation, 1, {"check": "disk"}), limit_s=120)
    for task in refused:
        assert task.status.phase is TaskPhase.FAILED
        message = task.status.conditions[-1].message
        assert "more than the 131072 this node takes (diagnosis.maxRequestBytes in its config)" in message, message
    assert grown < 256 << 10, grown
    assert small.status.phase is TaskPhase.SUCCEEDED, small.status.conditions
    assert server.answered == 1
