"""The agent's local control socket ``<dataDir>/control.sock``: one-line commands from the device.

Two commands: ``confirm <job name>``, sent by ``nodetaskd --role=edge --confirm <job>``, releases that
job's task waiting for confirmation on this node; ``status``, sent by ``nodetaskd edge status``, answers
the agent's state as one JSON line. The socket is the owner's only (mode 0600): confirming an upgrade is
privileged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import structlog

from nodetask.route import Route
from roles.edge.store.records import TaskState
from roles.edge.store.store import EdgeStore

__all__ = ["control_socket", "serve_control"]

Log = structlog.typing.FilteringBoundLogger

CONTROL_TIMEOUT_S: Final = 5.0
"""How long a client has to send its command."""


def control_socket(data_dir: Path) -> Path:
    """The agent's local control socket."""
    return data_dir / "control.sock"


async def serve_control(
    data_dir: Path,
    *,
    store: EdgeStore,
    confirm: Callable[[str], Awaitable[bool]],
    status: Callable[[], Awaitable[bytes]],
    log: Log,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the control socket until cancelled; ``confirm`` releases a waiting task by its job UID, ``status``
    is the agent's state as one line of JSON.

    Ready (``task_status.started()``) once listening, or at once when the socket cannot be made
    (e.g. a data directory whose path is too long for a unix socket): the agent works without it.
    """
    path = control_socket(data_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a stale socket from a killed agent
        listener = await anyio.create_unix_listener(path)
        path.chmod(0o600)
    except OSError as exc:
        log.warning("control_socket_unavailable", path=str(path), error=str(exc))
        task_status.started()
        return
    task_status.started()

    async def serve(stream: anyio.abc.SocketStream) -> None:
        # A client that hangs up before its answer ends its own exchange only: raised here, it would
        # end the listener's task group and the agent with it.
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            async with stream:
                with anyio.move_on_after(CONTROL_TIMEOUT_S):
                    request = (await stream.receive(1024)).decode(errors="replace").strip()
                    answer = await status() if request == "status" else await _answer(request, store, confirm)
                    await stream.send((answer if isinstance(answer, bytes) else answer.encode()) + b"\n")

    async with listener:
        await listener.serve(serve)


async def _answer(request: str, store: EdgeStore, confirm: Callable[[str], Awaitable[bool]]) -> str:
    command, _, job = request.partition(" ")
    if command != "confirm" or not job:
        return f"error: unknown command {request!r}; expected: confirm <job name>, or status"
    for task in await store.tasks(TaskState.WAITING_CONFIRMATION):
        if Route.parse(task.route).job == job:
            await confirm(task.job_uid)
            return f"ok: {job} resumes at {task.current_action}"
    return f"error: no task of job {job} is waiting for confirmation on this node"
