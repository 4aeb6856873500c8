"""The keeper of one script run: ``python -I -S reaper.py <argv>`` runs ``argv`` and, when it ends, kills
and reaps every process it left, wherever they went.

A process group does not hold a script's processes: anything that calls ``setsid`` (a daemon, a
double fork) leaves it and outlived the run. This process is a child subreaper
(``PR_SET_CHILD_SUBREAPER``): whatever the script starts is reparented here, not to init, when its
parent dies, so every process the script left is a descendant of this one until it is reaped, and
none can leave (a process cannot change its parent). When the script exits, or the agent says
stop, this process kills its children with SIGKILL, reaps them, and goes on with those reparented
to it meanwhile, until it has no child left; then it reports and exits. The agent therefore knows,
once this process has exited, that nothing of the run is left.

A cgroup would do the same with one write (``cgroup.kill``) but needs a writable cgroup2 tree that
the agent owns (``Delegate=`` under systemd; read-only in most containers), a kernel of 5.14 or
later, and still a process like this one to enter the cgroup before the script's first fork. A root
script can move itself out of a cgroup, while no process can leave its subreaper.

Its standard input is a socket to the agent: end of file there (the agent closed it, or died) means
stop; the one line this process writes back on it says how the script ended: ``exited <code>``,
``signalled <number>``, or ``unstarted <why>``. The script's standard input is ``/dev/null``; its
standard output and error are this process's. Standard library only: it runs without the agent's
packages (``-I -S``), and imports them never.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from typing import Final

__all__ = ["children_of", "main"]

PR_SET_CHILD_SUBREAPER: Final = 36
CONTROL_FD: Final = 0
RESCAN_S: Final = 0.05
"""How often the children are listed again while some are left that no SIGCHLD has reported yet (one just
reparented here, say)."""


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (zombies included), from ``/proc``."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:  # one thread: it has them all
            return [int(child) for child in file.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: every process's parent, from its stat line
        pass
    children = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                fields = file.read().rpartition(")")[2].split()
        except OSError:
            continue  # it has just ended
        if len(fields) > 1 and int(fields[1]) == pid:
            children.append(int(name))
    return children


class _Keeper:
    def __init__(self) -> None:
        self.stop = False
        self.status: int | None = None
        """The script's wait status, once reaped."""
        self.script = 0
        self.wakeup_read, wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_read, False)
        os.set_blocking(wakeup_write, False)
        signal.set_wakeup_fd(wakeup_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the poll up
        for stopping in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(stopping, self._stopped)

    def _stopped(self, *_: object) -> None:
        self.stop = True

    def reap(self) -> bool:
        """Reap every child that has ended, noting the script's status; whether any was."""
        reaped = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return reaped
            if pid == 0:
                return reaped
            reaped = True
            if pid == self.script:
                self.status = status

    def wait(self, timeout_s: float | None) -> None:
        """Until a signal arrives, the agent says stop (anything, or end of file, on the control socket), or
        ``timeout_s`` passes."""
        poller = select.poll()
        poller.register(self.wakeup_read, select.POLLIN)
        if not self.stop:  # once told, the socket's end of file would wake every poll at once
            poller.register(CONTROL_FD, select.POLLIN)
        for fd, _ in poller.poll(None if timeout_s is None else timeout_s * 1000):
            if fd == CONTROL_FD:
                self.stop = True
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wakeup_read, 4096)

    def kill_all(self) -> None:
        """Kill and reap every descendant, including those reparented here while it runs."""
        me = os.getpid()
        while True:
            for child in children_of(me):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            reaped = self.reap()
            try:
                os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return  # no child at all, alive or not
            if not reaped:
                # Killed children still dying, or one reparented here since the listing: the SIGCHLD of
                # the former ends the wait, the next listing finds the latter.
                self.wait(RESCAN_S)


def _report(line: str) -> None:
    with contextlib.suppress(OSError):  # the agent has gone, or stopped listening: nobody to tell
        os.write(CONTROL_FD, f"{line}\n".encode(errors="replace"))


def _become_subreaper() -> str | None:
    import ctypes  # noqa: PLC0415 (only here: the agent imports this module for its path and tests)

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def main(argv: list[str]) -> int:
    """Run ``argv`` as described in the module docstring; 0 once everything is reaped and reported."""
    if not argv:
        sys.stderr.write("usage: reaper.py COMMAND [ARG...]\n")
        return 2
    if (why := _become_subreaper()) is not None:
        _report(f"unstarted the run could not be kept (prctl PR_SET_CHILD_SUBREAPER: {why})")
        return 0
    keeper = _Keeper()
    try:
        keeper.script = os.posix_spawnp(
            argv[0],
            argv,
            os.environ,
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
            # Python ignores these; a script expects the defaults (a closed pipe ends `yes | head`).
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
    except OSError as exc:
        _report(f"unstarted {exc.strerror or exc}")
        return 0
    while keeper.status is None and not keeper.stop:
        keeper.wait(None)
        keeper.reap()
    keeper.kill_all()
    status = keeper.status
    if status is None:  # pragma: no cover - kill_all reaps the script too
        _report("unstarted the script was lost")
    elif os.WIFSIGNALED(status):
        _report(f"signalled {os.WTERMSIG(status)}")
    else:
        _report(f"exited {os.waitstatus_to_exitcode(status)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
