"""A role asking for its own process to be restarted in place (the edge, after a config update).

The request unwinds every task group first, so the store and the connections are closed
cleanly; :func:`reexec` then replaces the process image with the same command line. The PID stays
the same, so a service manager (systemd ``Type=simple``, a supervisor) sees one long-lived process.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


class RestartRequested(Exception):
    """Raised by a role to be restarted with the same command line; the message says why."""


def reexec() -> NoReturn:
    """Replace this process with a fresh run of the same command line."""
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
