"""The agent's cache on a real full filesystem: run by ``test_edge_full_disk`` inside a private mount namespace.

    unshare -rm sh -c 'mount -t tmpfs -o size=<bytes> tmpfs "$0" && exec python -m tests.integration.full_disk "$0"' DIR

``DIR`` is then a small tmpfs of this process's own. The real agent keeps its store and ledger there
and talks to a fake hub over memory links (``tests.unit.roles.edge.test_agent``), in virtual time:

1. autonomy is requested and the node's objects are cached; the filesystem is filled up with a file;
2. the hub sends three large Pods: their writes fail, the keys are errored, and the condition turns
   Unknown on the fourth failing check;
3. the agent restarts, the filesystem still full: the errored keys are still there;
4. the file is removed; the repair loop asks for the keys, the hub answers with the same Pods (nothing
   changed in the cloud), and the condition is True again.

What it saw is printed as one JSON object on stdout, for the test to check.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog
import trio
from trio.testing import MockClock

from nodetask.messages import Autonomy, AutonomyCondition, CacheFetch
from roles.edge.cache.ledger import key_text
from tests.unit.roles.edge.cache.cache_sessions import CACHE, next_of, objects, pod, welcomed
from tests.unit.roles.edge.doubles import running_edge

PODS = ("web-0", "web-1", "web-2")
CHUNK = 64 * 1024


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem has no room left; the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                written += os.write(fd, b"\xff" * CHUNK)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return written
    finally:
        os.close(fd)


async def scenario(home: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    big = [pod(name, 10 + i, data="p" * 3 * CHUNK) for i, name in enumerate(PODS)]
    async with running_edge(home, capabilities=CACHE) as edge:
        session = await welcomed(edge)
        await session.send(objects("Pod", pod("small", 5), replace=True, version="6"))
        await session.send(Autonomy(requested=True))  # answered once the Pod before it is stored
        seen["first"] = (await next_of(session, AutonomyCondition)).status
        filler = home / "filler"
        seen["filled_bytes"] = await anyio.to_thread.run_sync(fill, filler)
        await session.send(objects("Pod", *big))
        unknown = await next_of(session, AutonomyCondition)
        autonomy = edge.agent.autonomy
        seen["unknown"] = {"status": unknown.status, "reason": unknown.reason, "message": unknown.message}
        seen["failing_checks"] = autonomy.state.failing
        seen["errored"] = sorted(key_text(k) for k in autonomy.cache.ledger.errors)
        seen["persisted_while_full"] = autonomy.cache.ledger.persisted
    async with running_edge(home, capabilities=CACHE) as edge:
        autonomy = edge.agent.autonomy
        seen["errored_after_restart"] = sorted(key_text(k) for k in autonomy.cache.ledger.errors)
        seen["requested_after_restart"] = autonomy.cache.ledger.requested
        session = await edge.hub.accept()
        filler.unlink()
        fetch = await next_of(session, CacheFetch)
        seen["fetched"] = sorted(key_text(k) for k in fetch.keys)
        # The hub's answer: each key asked for, unchanged in the cloud.
        await session.send(objects("Pod", *(p for p in big if p["metadata"]["name"] in {k.name for k in fetch.keys})))
        while (condition := await next_of(session, AutonomyCondition)).status != "True":
            pass
        seen["final"] = {"status": condition.status, "reason": condition.reason}
        seen["errored_at_end"] = sorted(key_text(k) for k in autonomy.cache.ledger.errors)
        listing = await autonomy.cache.list("Pod", "default")
        seen["cached_at_end"] = [o["metadata"]["name"] for o in listing.items]
    return seen


def main() -> None:
    home = Path(sys.argv[1])
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    os.chdir(home)
    seen = trio.run(scenario, home, clock=MockClock(autojump_threshold=0.005))
    sys.stdout.buffer.write(msgspec.json.encode(seen) + b"\n")


if __name__ == "__main__":
    main()
