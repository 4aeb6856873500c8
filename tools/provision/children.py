"""Servers started by the provisioning scripts: spawned into their own session with a log, tied to the
starter's life unless detached, found again by PID and a marker in their command line, stopped with
SIGTERM and then SIGKILL.

Standard library only, like the scripts that use it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from tools.provision.host import ControlPlaneError

STOP_GRACE: Final = 10.0
"""Seconds between SIGTERM and SIGKILL when stopping a process."""

_PR_SET_PDEATHSIG: Final = 1


def proc_state(pid: int) -> str | None:
    """Kernel state letter of ``pid`` (``None`` if it does not exist)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rpartition(")")[2].split()[0]


def pid_is_ours(pid: int, marker: str) -> bool:
    """Whether ``pid`` is alive and its command line mentions ``marker`` (the
    state directory). Guards against killing an unrelated process that reused
    a PID recorded in a stale state file."""
    if pid <= 0 or proc_state(pid) in (None, "Z", "X"):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return marker in cmdline


def wait_exit(pid: int, timeout: float, child: subprocess.Popen[bytes] | None) -> bool:
    """Wait (without spinning) up to ``timeout`` for ``pid`` to exit."""
    if child is not None:
        try:
            child.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return True
        pidfd = -1
    if pidfd >= 0:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            return bool(poller.poll(timeout * 1000))
        finally:
            os.close(pidfd)
    deadline = time.monotonic() + timeout  # no pidfd support: poll /proc gently
    while proc_state(pid) not in (None, "Z", "X"):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def terminate(
    pid: int,
    marker: str,
    child: subprocess.Popen[bytes] | None = None,
    *,
    first: signal.Signals = signal.SIGTERM,
    grace: float = STOP_GRACE,
) -> None:
    """``first`` (SIGTERM), wait up to ``grace`` seconds, then SIGKILL and wait again."""
    if child is not None and child.poll() is not None:
        return
    if child is None and not pid_is_ours(pid, marker):
        return
    for sig in dict.fromkeys((first, signal.SIGKILL)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        if wait_exit(pid, grace, child):
            break
    else:
        raise ControlPlaneError(f"process {pid} survived SIGKILL for {grace:.0f}s")
    if child is not None:
        child.wait()


def die_with_parent() -> None:
    """preexec_fn: have the kernel SIGTERM the child if our (main) thread dies,
    so a test run killed with SIGKILL does not leak etcd/kube-apiserver."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def spawn(
    name: str, argv: Sequence[str], *, log: Path, detach: bool, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, stdout and stderr appended to ``log`` after a header line.

    Unless ``detach`` (a CLI's ``up``, whose servers must outlive it), the child is tied to this thread's
    life. PDEATHSIG fires when the *thread* that forked exits, so only the main thread qualifies: a
    restart from a short-lived worker thread must not arm it."""
    with open(log, "ab") as out:
        out.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}\n".encode())
        out.flush()
        tie = not detach and threading.current_thread() is threading.main_thread()
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            # Only a prctl() call runs between fork and exec: no locks, no
            # allocation, so the usual preexec_fn/threads hazard is absent.
            preexec_fn=die_with_parent if tie else None,  # noqa: PLW1509
        )


def tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


__all__ = ["STOP_GRACE", "die_with_parent", "pid_is_ours", "proc_state", "spawn", "tail", "terminate", "wait_exit"]
