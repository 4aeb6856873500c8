"""One job's status writer: coalesces the changes submitted within a short window into one write.

KubeEdge writes the whole job status once per action report, serialised per kind. Here every
change a hub makes to a job (claims, reported results) is a pure function from
:mod:`flows.nodejobs.changes`; the writer collects the ones submitted within ``window`` seconds,
applies them in order to a fresh copy of the job, writes once with the resourceVersion, and on a
409 re-reads and re-applies them all. Each submitter then learns its own change's outcome - only
after the write has succeeded, so an edge is never told a report is safe before it is.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog
import trio

from flows.nodejobs.changes import Change
from roles.cloud.api import JobStatusStore
from roles.kube import ApiError, Resource
from roles.kube.errors import Unreachable, too_large
from roles.kube.retrying import Outage

Log = structlog.typing.FilteringBoundLogger

WRITE_DEADLINE_S = 30.0


class _Submitted:
    __slots__ = ("abandoned", "change", "done", "error", "outcome")

    def __init__(self, change: Change) -> None:
        self.change = change
        self.done = trio.Event()  # one per report: anyio's wrapper costs as much again
        self.outcome: Any = None
        self.error: ApiError | None = None
        self.abandoned = False


class StatusWriter:
    """Writes the status changes of job ``name`` (or of any object with a status: a diagnosis Task, in its
    ``namespace``). Run :meth:`run` in a task group, then :meth:`submit`.

    ``window`` 0 turns coalescing off: one write per change (the benchmark's baseline).
    """

    def __init__(
        self,
        store: JobStatusStore,
        resource: Resource[Any],
        name: str,
        *,
        window: float,
        log: Log,
        on_written: Callable[[Any], None] = lambda _: None,
        cached: Callable[[], Any] = lambda: None,
        finish: Callable[[Any], Any] = lambda job: job,
        on_too_large: Callable[[ApiError], Awaitable[None]] | None = None,
        on_failed: Callable[[ApiError], None] = lambda _: None,
        namespace: str = "",
    ) -> None:
        self._store = store
        self._resource = resource
        self._name = name
        self._namespace = namespace
        self._window = window
        self._finish = finish
        """Applied once to a batch's result before it is written (e.g. derived fields)."""
        self._on_too_large = on_too_large
        self._on_failed = on_failed
        self._too_large = False
        """The last write was refused as too large (reported once, until a write succeeds)."""
        self._log = log
        self._outage = Outage(log, "status_write_failed")
        """Failed writes since the last one that worked: their submitters retry, this logs the outage once."""
        self._on_written = on_written
        self._cached = cached
        """The newest copy of the job the hub holds, tried before reading it again."""
        self._send, self._recv = anyio.create_memory_object_stream[_Submitted](max_buffer_size=math.inf)
        self.batches = 0
        """Writes attempted that succeeded (a metric; a batch that changed nothing is not written)."""

    async def submit(self, change: Change) -> Any:
        """Apply ``change`` in the next write and return its outcome once that write succeeded.

        Errors: the :class:`~roles.kube.ApiError` that made the write fail (NotFound: the job is gone).
        A cancelled submitter's change is skipped unless its write has already begun.
        """
        item = _Submitted(change)
        self._send.send_nowait(item)
        try:
            await item.done.wait()
        finally:
            item.abandoned = not item.done.is_set()
        if item.error is not None:
            raise item.error
        return item.outcome

    def close(self) -> None:
        """Stop taking changes; :meth:`run` returns once the queued ones are written."""
        self._send.close()

    async def run(self) -> None:
        """Write batches until :meth:`close` (or cancellation)."""
        async with self._recv:
            async for first in self._recv:
                batch = [first]
                if self._window > 0:
                    await anyio.sleep(self._window)
                    while True:
                        try:
                            batch.append(self._recv.receive_nowait())
                        except (anyio.WouldBlock, anyio.EndOfStream):
                            break
                live = [item for item in batch if not item.abandoned]
                if live:
                    await self._write(live)

    async def _write(self, batch: list[_Submitted]) -> None:
        outcomes: list[Any] = []
        wrote = False

        def mutate(job: Any) -> Any:
            nonlocal wrote
            outcomes.clear()
            current, changed = job, False
            for item in batch:
                new, outcome = item.change(current)
                outcomes.append(outcome)
                if new is not None:
                    current, changed = new, True
            wrote = changed  # the last attempt is the one whose answer comes back
            return self._finish(current) if changed else None

        error: ApiError | None = None
        updated: Any = None
        # Once begun, a write finishes (or gives up after WRITE_DEADLINE_S): its submitters must
        # learn whether it happened, even when the hub is shutting down.
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + WRITE_DEADLINE_S) as scope:
            try:
                updated = await self._store.update_status(
                    self._resource, self._name, mutate, current=self._cached(), namespace=self._namespace
                )
            except ApiError as exc:
                error = exc
        if scope.cancelled_caught:
            error = Unreachable(0, "Timeout", f"no answer within {WRITE_DEADLINE_S:g}s", what=f"status of {self._name}")
        if error is not None:
            self._outage.noted(error, changes=len(batch))
            self._on_failed(error)
            for item in batch:
                item.error = error
                item.done.set()
            if too_large(error) and not self._too_large:
                # Retrying cannot help until the job shrinks; the results wait in the edges' outboxes.
                self._too_large = True
                self._log.error("job_status_too_large", error=str(error))
                if self._on_too_large is not None:
                    await self._on_too_large(error)
            return
        self._outage.recovered()
        if wrote:
            # Only a write that happened shows the job fits again; a batch that changed nothing does not.
            self._too_large = False
        self.batches += 1
        if updated is not None:
            self._on_written(updated)
        for item, outcome in zip(batch, outcomes, strict=True):
            item.outcome = outcome
            item.done.set()
