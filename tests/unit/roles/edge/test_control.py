"""The edge's control socket answers its commands and survives clients that hang up early."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import anyio
import structlog

from roles.edge.control import control_socket, serve_control
from roles.edge.store.records import NodeTask, TaskState
from roles.edge.store.store import EdgeStore


class _NoneWaiting:
    """A store in which no task waits for confirmation."""

    async def tasks(self, state: TaskState) -> list[NodeTask]:
        return []


async def _confirm(job_uid: str) -> bool:
    raise AssertionError("nothing waits for confirmation here")


async def _status() -> bytes:
    return b'{"node":"edge-1"}'


async def _ask(path: Path, command: bytes) -> str:
    async with await anyio.connect_unix(path) as stream:
        await stream.send(command)
        return (await stream.receive()).decode()


async def test_a_client_that_hangs_up_early_leaves_the_control_socket_serving(tmp_path: Path) -> None:
    """A client that closes before its answer (or sends nothing) ends its own exchange, not the agent's socket;
    ``status`` answers the agent's line, and an unknown command names the known ones."""
    store = cast("EdgeStore", _NoneWaiting())
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(
                lambda task_status: serve_control(
                    tmp_path,
                    store=store,
                    confirm=_confirm,
                    status=_status,
                    log=structlog.get_logger(),
                    task_status=task_status,
                )
            )
            path = control_socket(tmp_path)
            for _ in range(3):
                stream = await anyio.connect_unix(path)
                await stream.aclose()  # the server's receive meets the end of the stream
                stream = await anyio.connect_unix(path)
                await stream.send(b"confirm job-a")
                await stream.aclose()  # gone before the answer is written
            answer = await _ask(path, b"confirm job-a")
            assert answer == "error: no task of job job-a is waiting for confirmation on this node\n"
            assert await _ask(path, b"status\n") == '{"node":"edge-1"}\n'
            unknown = await _ask(path, b"reboot")
            assert unknown == "error: unknown command 'reboot'; expected: confirm <job name>, or status\n"
            tg.cancel_scope.cancel()
