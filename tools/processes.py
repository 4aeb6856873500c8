"""Child processes for tests, benchmarks and the demo: the one harness they share.

A role started as the binary runs it (:func:`role_command`), waited for until it serves
(:func:`until_ready`, its ``/readyz``) or until it reports the ports it bound on port 0
(:func:`until_ports`), stopped as a supervisor does (:func:`terminate`: SIGTERM, then SIGKILL after a
grace period), and live processes found in the process table.
"""

from __future__ import annotations

import functools
import os
import signal
import ssl
import sys
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import anyio
import anyio.abc

from tools.ports import reported

POLL_S = 0.2
"""Seconds between two looks at a starting process."""


class NotReady(Exception):
    """A started process exited, or was still not ready at the limit; the message says which, and what for."""


def role_command(
    role: str, config: Path, *, module: str = "roles.cli", python: str | Path = sys.executable
) -> list[str]:
    """The command line of ``nodetaskd --role=ROLE --config=CONFIG`` under ``python`` (this interpreter by default).

    ``module`` runs another entry point taking the same arguments (``bench.hubproc`` raises the fd limit first).
    """
    return [str(python), "-m", module, f"--role={role}", f"--config={config}"]


def http_get(url: str, *, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> tuple[int, str]:
    """The status and text a GET of ``url`` answers now; (0, "") when it fails (refused, timed out, not 2xx)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as answer:
            return int(answer.status), str(answer.read().decode(errors="replace"))
    except OSError:
        return 0, ""


def answers_ok(url: str, *, context: ssl.SSLContext | None = None) -> bool:
    """Whether a GET of ``url`` answers 200 now (a refused or timed-out connection does not)."""
    return http_get(url, context=context)[0] == 200


async def until_ready(
    process: anyio.abc.Process, url: str, *, limit_s: float, context: ssl.SSLContext | None = None
) -> None:
    """Wait until ``url`` (the process's ``/readyz``) answers 200.

    Errors: :class:`NotReady` once ``process`` has exited, or after ``limit_s`` seconds.
    """
    with anyio.move_on_after(limit_s):
        while not await anyio.to_thread.run_sync(functools.partial(answers_ok, url, context=context)):
            if process.returncode is not None:
                raise NotReady(f"exited with status {process.returncode} before {url} answered 200")
            await anyio.sleep(POLL_S)
        return
    raise NotReady(f"was not ready after {limit_s:g} s ({url} did not answer 200)")


async def until_ports(process: anyio.abc.Process, ports_file: Path, *, limit_s: float) -> dict[str, int]:
    """The ports a process started on port 0 wrote to ``ports_file``, by setting (a hub's ``listen``, ``httpListen``).

    Errors: :class:`NotReady` once ``process`` has exited, or after ``limit_s`` seconds.
    """
    with anyio.move_on_after(limit_s):
        while (bound := reported(ports_file, pid=process.pid)) is None:
            if process.returncode is not None:
                raise NotReady(f"exited with status {process.returncode} before it wrote {ports_file}")
            await anyio.sleep(POLL_S)
        return bound
    raise NotReady(f"had not written its ports to {ports_file} after {limit_s:g} s")


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
