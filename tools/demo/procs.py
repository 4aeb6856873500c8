"""The demo's child processes: started in their own process groups, stopped and verified gone.

Why process groups and a marker: every process the demo starts gets its own session (so a Ctrl-C in
the terminal reaches only the demo, which then stops the children in order) and mentions the demo's
state directory on its command line (its config lives there). After stopping, ``/proc`` is scanned
for any process still mentioning that directory: that is the proof that nothing was left behind,
and it also finds leftovers of an earlier run that was killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tools.processes import processes_mentioning
from tools.provision import controlplane as _cp

STOP_GRACE: Final = 10.0
"""Seconds between SIGTERM and SIGKILL for a process group."""


@dataclass
class Child:
    """One started process: its role name, Popen and log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Supervisor:
    """Starts children and stops them all, last started first within each :meth:`stop` call."""

    marker: str
    """A string on every child's command line (the demo's state directory)."""
    children: list[Child] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    """Every PID started, stopped or not: each leads its own session (:func:`tools.processes.processes_in_sessions`)."""

    def start(self, name: str, argv: Sequence[str], *, log: Path) -> Child:
        """Start ``argv`` in its own session with stdout and stderr appended to ``log``."""
        if not any(self.marker in arg for arg in argv):
            raise ValueError(f"{name}: the command line must mention {self.marker} (found by the leftover scan)")
        # PDEATHSIG is armed only from the main thread: it fires when the forking *thread* exits.
        tie = threading.current_thread() is threading.main_thread()
        with _interrupts_deferred():
            with open(log, "ab") as out:
                popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    # Only a prctl() runs between fork and exec, so the preexec_fn/threads hazard is absent.
                    preexec_fn=_cp._die_with_parent if tie else None,  # noqa: PLW1509
                )
            child = Child(name=name, popen=popen, log=log)
            self.children.append(child)
            self.started.append(popen.pid)
        return child

    def dead(self) -> list[Child]:
        return [c for c in self.children if not c.alive()]

    def stop(self, names: Iterable[str] | None = None, *, grace: float = STOP_GRACE) -> None:
        """SIGTERM the process groups of the chosen children (all by default), SIGKILL after ``grace``."""
        wanted = set(names) if names is not None else None
        chosen = [c for c in self.children if wanted is None or c.name in wanted]
        for child in reversed(chosen):
            _signal_group(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in chosen:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(max(0.0, deadline - time.monotonic()))
        for child in chosen:
            # The group, not only the leader: a child's own children must not survive it.
            _signal_group(child.pid, signal.SIGKILL)
            child.popen.wait()
        self.children = [c for c in self.children if c not in chosen]


STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold back the demo's stop signals until the block is over, then act on the first one as it would have.

    A Ctrl-C landing between a child's fork and its being recorded would raise there and leave that child
    running, unknown to :meth:`Supervisor.stop`. Python runs signal handlers in the main thread only, so
    elsewhere nothing can land in between and nothing is deferred.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    before = {signum: signal.signal(signum, lambda signum, _: caught.append(signum)) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    if not caught:
        return
    handler = before[signal.Signals(caught[0])]
    if callable(handler):
        handler(caught[0], None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(caught[0])


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_recorded(record: Path, marker: str, *, grace: float = STOP_GRACE) -> list[str]:
    """Stop the processes listed in ``record`` (by :func:`write_record`) that still mention ``marker``.

    For leftovers of a run that could not clean up (killed with SIGKILL). Only recorded PIDs whose
    command line still mentions ``marker`` are signalled, so a reused PID is never touched.
    """
    try:
        pids = [int(p) for p in record.read_text().split()]
    except (OSError, ValueError):
        return []
    live = processes_mentioning(marker)
    found = {pid: live[pid] for pid in pids if pid in live}
    for pid in found:
        _signal_group(pid, signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while set(found) & set(processes_mentioning(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in set(found) & set(processes_mentioning(marker)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"pid {pid}: {command[:160]}" for pid, command in found.items()]


def write_record(record: Path, pids: Iterable[int]) -> None:
    """Record ``pids`` (one per line) for :func:`kill_recorded` after a crash."""
    _cp._write_atomic(record, "".join(f"{pid}\n" for pid in pids))
