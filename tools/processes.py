"""Stopping a child process the way a supervisor does: SIGTERM, then SIGKILL after a grace period."""

from __future__ import annotations

import signal

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
