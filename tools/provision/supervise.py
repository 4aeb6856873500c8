#!/usr/bin/env python3
"""A device's service supervisor, as systemd's ``Restart=always`` is one: it keeps one command running.

A real node's kubelet runs under whatever supervises it on the device (systemd, mostly), and a kubelet
upgrade restarts it through that supervisor (the agent's ``kubelet.restartCommand``). The test and demo
nodes have no systemd, so this stands in for it::

    python3 tools/provision/supervise.py -- COMMAND [ARG...]

- the command is started again one second after it exits, whatever its status (``RestartSec=1``),
  each start announced on stdout; it reads its executable afresh, so a replaced binary runs next;
- SIGHUP restarts it now: SIGTERM, up to 10 s, SIGKILL, start again (``systemctl restart``);
- SIGTERM or SIGINT stops it the same way and exits.

The command dies with the supervisor (PDEATHSIG), so a power cut that kills the supervisor kills it too.
Standard library only: it runs as a script.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Final

RESTART_SECONDS: Final = 1.0
STOP_GRACE: Final = 10.0
_PR_SET_PDEATHSIG: Final = 1


def _die_with_supervisor() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _stop(child: subprocess.Popen[bytes]) -> int:
    child.terminate()
    try:
        return child.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def supervise(command: Sequence[str]) -> int:
    """Keep ``command`` running until SIGTERM or SIGINT; SIGHUP restarts it. Returns the exit status to use."""
    asked: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        asked.append("restart" if signum == signal.SIGHUP else "stop")

    for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    while True:
        # preexec_fn runs one prctl() between fork and exec, nothing that takes a lock.
        child = subprocess.Popen(list(command), preexec_fn=_die_with_supervisor)  # noqa: PLW1509
        print(f"supervise: started pid {child.pid}: {' '.join(command)}", flush=True)
        while child.poll() is None and not asked:
            time.sleep(0.1)
        if asked:
            status = _stop(child) if child.poll() is None else child.returncode
            word = asked.pop(0)
            print(f"supervise: {word} asked; pid {child.pid} exited {status}", flush=True)
            if word == "stop":
                return 0
            asked.clear()
            continue
        print(f"supervise: pid {child.pid} exited {child.returncode}; again in {RESTART_SECONDS:g}s", flush=True)
        deadline = time.monotonic() + RESTART_SECONDS
        while time.monotonic() < deadline and "stop" not in asked:
            time.sleep(0.1)
        if "stop" in asked:
            return 0
        asked.clear()


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[0] != "--":
        print("usage: supervise.py -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return supervise(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
