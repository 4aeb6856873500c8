"""A role asking for its own process to be restarted (the edge, after a config update or an upgrade).

The request unwinds every task group first, so the store and the connections are closed
cleanly. Then :func:`reexec` either replaces the process image with the same command line (the
PID stays the same, so a service manager sees one long-lived process), or, when a supervisor
started the agent (:data:`SUPERVISOR_ENV` is set, as ``roles.edge.launcher.launcher`` does), exits with
:data:`EXIT_RESTART` so that the supervisor starts it again, possibly as another installed version.
"""

from __future__ import annotations

import os
import sys
from typing import Final, NoReturn

SUPERVISOR_ENV: Final = "NODETASKD_SUPERVISOR"
"""Set by a supervisor that restarts the agent itself; its value names the supervisor."""
EXIT_RESTART: Final = 75
"""The exit status asking a supervisor for a restart (``EX_TEMPFAIL``)."""


class RestartRequested(Exception):
    """Raised by a role to be restarted with the same command line; the message says why."""


def reexec() -> NoReturn:
    """Replace this process with a fresh run of the same command line, or leave it to the supervisor."""
    if os.environ.get(SUPERVISOR_ENV):
        # Only the supervisor knows which version `current` now points at; a re-exec would keep this one's paths.
        raise SystemExit(EXIT_RESTART)
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
