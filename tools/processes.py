"""Child processes for tests, benchmarks and the demo: stopping one as a supervisor does (SIGTERM, then
SIGKILL after a grace period) and finding live ones in the process table."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path

import anyio
import anyio.abc


async def terminate(process: anyio.abc.Process, *, grace: float = 15.0) -> int | None:
    """Stop ``process`` and reap it; its exit status, or None if it had to be killed.

    Shielded: it runs in ``finally`` blocks of cancelled tests and benchmarks, where leaving a
    child running would leak it into whatever runs next.
    """
    with anyio.CancelScope(shield=True):
        if process.returncode is not None:
            return process.returncode
        process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(grace):
            return await process.wait()
        process.kill()
        await process.wait()
    return None


def processes_in_sessions(leaders: Iterable[int]) -> dict[int, str]:
    """Live processes (not zombies) in the sessions led by ``leaders``: whatever those started, too.

    Everything the demo starts, directly or through tools/provision/controlplane.py and tools/provision/containerd.py,
    gets a session of its own, so this finds exactly the demo's processes and their descendants -
    not, say, a ``tail -f`` of a log in the state directory.
    """
    sessions = set(leaders)
    return {pid: command for pid, state, sid, command in _processes() if sid in sessions and state not in ("Z", "X")}


def _processes() -> list[tuple[int, str, int, str]]:
    """(pid, state, session id, command line) of every process but this one."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        command = " ".join(a.decode(errors="replace") for a in argv if a)
        out.append((int(entry.name), fields[0], int(fields[3]), command))
    return out


def processes_mentioning(marker: str) -> dict[int, str]:
    """Live processes (not zombies) other than this one whose command line contains ``marker``."""
    return {pid: command for pid, state, _, command in _processes() if marker in command and state not in ("Z", "X")}
