"""Node marks: which hub holds each edge's session, recorded on its Node, and the marks under way.

A session's Node gets this hub's id and the agent's version as annotations (the controller reads
them to tell connected nodes); when the session ends, the mark comes off unless another hub holds
the node by then. A refused mark is retried with backoff for as long as the session lasts, and one
whose Node does not exist yet waits for the Node watch to show it (:meth:`NodeMarks.mark`).

A mark is written only when it changes the Node: one the Node watch shows carrying this hub's id and
the agent's version already (:mod:`~roles.cloud.nodes.marked_nodes`) is skipped, as a fleet reconnecting to
a restarted hub finds its Nodes. The unmark at the session's end is the same either way.

Each attempt of a mark waits for a slot among the API client's requests and then for its answer
(the pause between retries is not waiting in that sense). In a connect storm
thousands wait at once, which is fine while they drain; a mark that waits far longer than that means
the hub's writes are stuck, while its sessions and heartbeats look healthy. :class:`PendingMarks`
counts them for the hub's metrics and readiness.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Final

import anyio
import anyio.lowlevel
import structlog

from nodetask.backoff import Backoff
from roles.cloud.api import NodeStore
from roles.cloud.nodes.marked_nodes import mark_needed
from roles.kube import ApiError, Conflict, NotFound
from roles.kube.resources import NODES
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION

__all__ = ["FAILED", "SKIPPED", "WRITTEN", "NodeMarks", "PendingMarks"]

Log = structlog.typing.FilteringBoundLogger

WRITTEN: Final = "written"
"""The mark landed (perhaps after retries)."""
SKIPPED: Final = "skipped"
"""The Node carried the mark already."""
FAILED: Final = "failed"
"""The mark was refused, and the session ended before a retry landed."""

RETRY_INITIAL: Final = 1.0
RETRY_CAP: Final = 60.0
"""A refused mark is retried after 1 s, doubling up to a minute: a fleet's marks failing at once then
cost the API server a few hundred requests a second at most, spread out."""


class PendingMarks:
    """Marks under way, each with the time it began (``now`` is the event loop's clock)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._since: dict[int, float] = {}
        self._ids = itertools.count()

    @contextmanager
    def pending(self) -> Iterator[None]:
        """Count one mark as pending for the duration of the block."""
        key = next(self._ids)
        self._since[key] = self._now()
        try:
            yield
        finally:
            del self._since[key]

    def __len__(self) -> int:
        return len(self._since)

    def oldest_age(self) -> float:
        """Seconds the oldest pending mark has waited; 0 when none is pending."""
        # Insertion order is start order, and a dict keeps it across deletions.
        first = next(iter(self._since.values()), None)
        return 0.0 if first is None else self._now() - first


class NodeMarks:
    """Marks and unmarks the Nodes of this hub's sessions, keeping count in ``pending``."""

    def __init__(
        self,
        api: NodeStore,
        pending: PendingMarks,
        *,
        hub_id: str,
        close_grace: float,
        pending_limit: float,
        seen: Callable[[str], str | None],
        awaiting: Callable[[str], AbstractContextManager[anyio.Event]],
        settled: Callable[[str], None],
        log: Log,
    ) -> None:
        """``seen`` says which agent version a Node's mark says if it is this hub's (None: not known to
        be); ``awaiting`` gives an event set when the Node watch shows a Node of that name (see
        :meth:`~roles.cloud.nodes.marked_nodes.MarkedNodes.awaiting`); ``settled`` is told how each mark
        ended: :data:`WRITTEN`, :data:`SKIPPED` or :data:`FAILED`."""
        self._api = api
        self.pending = pending
        self._seen = seen
        self._awaiting = awaiting
        self._settled = settled
        self._hub_id = hub_id
        self._close_grace = close_grace
        self._pending_limit = pending_limit
        self._log = log
        self._unmarking: set[anyio.CancelScope] = set()
        self._unmark_deadline = math.inf

    async def mark(self, node: str, version: str, log: Log, *, answered: Callable[[], None] = lambda: None) -> None:
        """Mark the Node as held by this hub, at the agent's ``version``, for as long as the caller waits.

        Each attempt waits its turn among the API client's requests, however long a connect storm
        makes that. Cancelled, an attempt still waiting for its turn is dropped (nothing was sent),
        and one already sent is awaited for ``close_grace``: it could otherwise land after the
        unmark that follows the session's end. Skipped when the Node is known to carry this mark
        already. ``answered`` is called once the first attempt is answered (or the mark skipped),
        whatever the answer: the session goes on while a refused mark is retried.

        A refused mark is retried after a capped, jittered backoff until it lands or the caller
        stops waiting: otherwise one API server hiccup leaves the controller seeing a connected node
        as not connected (its Pending tasks time out) and the Node's agent version stale. A Node
        that does not exist (an edge may connect before its Node is registered) is not polled:
        the mark waits for the Node watch to show a Node of that name, then tries again, and so
        never lands if that Node never comes (or the hub may not watch Nodes).
        """
        if not mark_needed(self._seen(node), version):
            self._settled(SKIPPED)
            answered()
            return
        patch = {"metadata": {"annotations": {HUB_ANNOTATION: self._hub_id, AGENT_VERSION_ANNOTATION: version}}}
        backoff = Backoff(initial=RETRY_INITIAL, cap=RETRY_CAP)
        failures = 0
        error: ApiError
        try:
            with ExitStack() as stack:
                appeared: anyio.Event | None = None
                while True:
                    try:
                        with self.pending.pending():
                            await self._api.merge_patch(NODES, node, patch, grace=self._close_grace)
                        break
                    except NotFound as exc:
                        error, retry = exc, "when the Node appears"
                        if appeared is None or appeared.is_set():
                            # From now on the watch tells of the Node's creation; one created since
                            # this answer is found by trying again at once.
                            appeared = stack.enter_context(self._awaiting(node))
                            wait = anyio.lowlevel.checkpoint
                        else:
                            wait = appeared.wait
                    except ApiError as exc:
                        error, retry = exc, "with backoff"
                        wait = functools.partial(anyio.sleep, backoff.delay())
                    failures += 1
                    if failures == 1:
                        # The session still works meanwhile; the controller sees the node as not connected.
                        log.warning("node_not_marked", error=str(error), retry=retry)
                        answered()
                    else:
                        log.debug("node_mark_retry_failed", error=str(error), failures=failures)
                    await wait()
        except BaseException:
            if failures:
                self._settled(FAILED)  # refused, then given up on when the session ended
            raise
        self._settled(WRITTEN)
        if failures:
            log.info("node_marked", failures=failures)
        else:
            answered()

    async def unmark(self, node: str, log: Log) -> None:
        """Take this hub's mark off the Node of an ended session.

        No deadline while the hub runs: when many sessions end at once, their unmarks queue behind
        the API client's limit just as a storm's marks do, and one cut off would leave the Node
        claiming a session that is gone. Only a stopping hub bounds them (:meth:`bound_unmarks`).
        """
        with anyio.CancelScope(deadline=self._unmark_deadline) as scope:
            self._unmarking.add(scope)
            try:
                await self._unmark(node, log)
            finally:
                self._unmarking.discard(scope)
        if scope.cancelled_caught:
            log.warning("node_not_unmarked", error="the hub stopped before its turn came")

    def bound_unmarks(self) -> None:
        """The hub is stopping: unmarks under way or to come get ``close_grace`` from now."""
        self._unmark_deadline = anyio.current_time() + self._close_grace
        for scope in self._unmarking:
            scope.deadline = min(scope.deadline, self._unmark_deadline)

    @property
    def unmarks_pending(self) -> int:
        """Unmarks of ended sessions not yet answered."""
        return len(self._unmarking)

    def stuck(self) -> str:
        """Why the marks count as stuck (the oldest has waited past ``markPendingLimit``), or empty."""
        age = self.pending.oldest_age()
        if age <= self._pending_limit:
            return ""
        return (
            f"Node marks stuck: {len(self.pending)} pending, the oldest for {age:.0f} s"
            f" (markPendingLimit {self._pending_limit:g} s)"
        )

    async def watch(self) -> None:
        """Log when Node marks start and stop being stuck (readiness and metrics say so meanwhile)."""
        stuck = False
        while True:
            await anyio.sleep(min(10.0, self._pending_limit / 4))
            why = self.stuck()
            if why and not stuck:
                self._log.warning("node_marks_stuck", error=why)
            elif stuck and not why:
                self._log.info("node_marks_flowing", pending=len(self.pending))
            stuck = bool(why)

    async def _unmark(self, node: str, log: Log) -> None:
        for _ in range(5):
            try:
                current = await self._api.get(NODES, node)
                if current.metadata.annotations.get(HUB_ANNOTATION) != self._hub_id:
                    return  # another hub holds the node now
                patch = {
                    "metadata": {
                        "resourceVersion": current.metadata.resource_version,
                        "annotations": {HUB_ANNOTATION: None},
                    }
                }
                await self._api.merge_patch(NODES, node, patch)
                return
            except Conflict:
                continue
            except ApiError as exc:
                log.warning("node_not_unmarked", error=str(exc))
                return
