"""The cloud role as the hub-capacity benchmark runs it: ``nodetaskd --role=cloud``, fd limit raised.

``python -m bench.hubproc --role=cloud --config FILE`` raises RLIMIT_NOFILE to its hard limit (one
descriptor per edge session) and then runs :func:`roles.cli.main.main` unchanged.
"""

from __future__ import annotations

import sys

from bench.fleet import raise_fd_limit
from roles.cli.main import main

if __name__ == "__main__":
    raise_fd_limit()
    raise SystemExit(main(sys.argv[1:]))
