"""Node marks: which hub holds each edge's session, recorded on its Node, and the marks under way.

A session's Node gets this hub's id and the agent's version as annotations (the controller reads
them to tell connected nodes); when the session ends, the mark comes off unless another hub holds
the node by then.

A mark is written only when it changes the Node: one the Node watch shows carrying this hub's id and
the agent's version already (:mod:`~roles.cloud.marked_nodes`) is skipped, as a fleet reconnecting to
a restarted hub finds its Nodes. The unmark at the session's end is the same either way.

A mark waits for a slot among the API client's requests and then for its answer. In a connect storm
thousands wait at once, which is fine while they drain; a mark that waits far longer than that means
the hub's writes are stuck, while its sessions and heartbeats look healthy. :class:`PendingMarks`
counts them for the hub's metrics and readiness.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

import anyio
import structlog

from roles.cloud.api import NodeStore
from roles.cloud.marked_nodes import mark_needed
from roles.kube import ApiError, Conflict
from roles.kube.resources import NODES
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION

__all__ = ["FAILED", "SKIPPED", "WRITTEN", "NodeMarks", "PendingMarks"]

Log = structlog.typing.FilteringBoundLogger

WRITTEN: Final = "written"
SKIPPED: Final = "skipped"
FAILED: Final = "failed"


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
        settled: Callable[[str], None],
        log: Log,
    ) -> None:
        """``seen`` says which agent version a Node's mark says if it is this hub's (None: not known to
        be); ``settled`` is told how each mark ended: :data:`WRITTEN`, :data:`SKIPPED` or :data:`FAILED`."""
        self._api = api
        self.pending = pending
        self._seen = seen
        self._settled = settled
        self._hub_id = hub_id
        self._close_grace = close_grace
        self._pending_limit = pending_limit
        self._log = log
        self._unmarking: set[anyio.CancelScope] = set()
        self._unmark_deadline = math.inf

    async def mark(self, node: str, version: str, log: Log) -> None:
        """Mark the Node as held by this hub, at the agent's ``version``.

        The mark waits its turn among the API client's requests for as long as the caller waits,
        however long a connect storm makes that. Cancelled, a mark still waiting for its turn is
        dropped (nothing was sent), and one already sent is awaited for ``close_grace``: it could
        otherwise land after the unmark that follows the session's end. Skipped when the Node is known
        to carry this mark already.
        """
        if not mark_needed(self._seen(node), version):
            self._settled(SKIPPED)
            return
        annotations = {HUB_ANNOTATION: self._hub_id, AGENT_VERSION_ANNOTATION: version}
        with self.pending.pending():
            try:
                await self._api.merge_patch(
                    NODES, node, {"metadata": {"annotations": annotations}}, grace=self._close_grace
                )
            except ApiError as exc:
                # The session still works; the controller then sees the node as not connected.
                log.warning("node_not_marked", error=str(exc))
                self._settled(FAILED)
                return
        self._settled(WRITTEN)

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
