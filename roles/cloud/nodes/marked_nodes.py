"""Which Nodes already carry this hub's mark, and at which agent version, as the Node watch shows them.

A fleet reconnecting to a restarted hub finds its Nodes still marked with that hub's id and the
agents' versions (a killed hub never unmarked them): writing the same two annotations again would
cost one API write per edge, the bulk of a reconnect storm's work. :class:`MarkedNodes` follows
the Node watch, keeping only the Nodes that name this hub (their agent version each), so that
:class:`~roles.cloud.nodes.marks.NodeMarks` writes a mark only when it would change the Node.

Knowledge is trusted only while the watch is current: until its first list, and from a failure
of the watch until its next list, every mark is written. The hub has one Node watch: with cache
streams on it is theirs (:meth:`MarkedNodes.apply` takes its events), else this module's own. Either
lists the Nodes as their metadata only (a cluster's Nodes whole cost a restarted hub a large part of its
start), and this module's own also watches them so: it reads nothing else.

What the watch has not delivered yet is not seen: an edge that moved to another hub and back
within the watch's lag finds its mark skipped while the Node names the other hub, whose unmark
at its session's end then leaves the Node unmarked until the edge's next session. Marks of two
hubs could already cross like that (a mark queued in one hub's storm landing after the other's).

The watch also tells a mark whose Node does not exist yet when a Node of that name appears
(:meth:`MarkedNodes.awaiting`): an edge may connect before its Node is registered.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import anyio
import anyio.abc
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from roles.cloud.api import Watcher
from roles.kube import Deleted, Interrupted, Invalid, Relisted, Upserted, WatchEvent
from roles.kube.resources import NODE_METADATA
from schemas.core import MarkAnnotations, NodeHeadMeta, RawObject

__all__ = ["MarkedNodes", "mark_needed", "own_version"]

Log = structlog.typing.FilteringBoundLogger

_META: Final = msgspec.json.Decoder(NodeHeadMeta)


def own_version(marks: MarkAnnotations, hub_id: str) -> str | None:
    """The agent version a Node's mark says when the mark is ``hub_id``'s; None when it is not, or names none."""
    return marks.agent_version if marks.hub == hub_id else None


def mark_needed(seen: str | None, version: str) -> bool:
    """Whether a session's Node must be written: unless it is known (``seen``, this hub's mark's agent
    version; None: not known to carry this hub's mark) to say this hub and ``version`` already."""
    return seen != version


class MarkedNodes:
    """The Nodes whose mark is this hub's. :meth:`run` it; with ``watcher`` None another watch feeds :meth:`apply`."""

    def __init__(self, watcher: Watcher | None, *, hub_id: str, log: Log) -> None:
        self._watcher = watcher
        self._hub_id = hub_id
        self._log = log
        self._versions: dict[str, str] = {}
        self._current = False
        """Listed, and not failed since: what ``_versions`` says holds, bar the watch's lag."""
        self._settled = anyio.Event()
        self._awaited: dict[str, set[anyio.Event]] = {}
        """Events of marks waiting for their Node to appear, by Node name."""

    def seen(self, node: str) -> str | None:
        """The agent version ``node``'s mark says if the mark is this hub's, as far as the watch shows; else None."""
        return self._versions.get(node) if self._current else None

    def __len__(self) -> int:
        return len(self._versions)

    @contextmanager
    def awaiting(self, node: str) -> Iterator[anyio.Event]:
        """An event set once the watch shows a Node named ``node`` (listed, created or changed) while the block lasts.

        Only what the watch delivers from now on sets it: a Node created before is found by reading it.
        """
        appeared = anyio.Event()
        self._awaited.setdefault(node, set()).add(appeared)
        try:
            yield appeared
        finally:
            waiting = self._awaited.get(node)
            if waiting is not None:
                waiting.discard(appeared)
                if not waiting:
                    del self._awaited[node]

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the Node watch until cancelled (its own, given a watcher); ready once it has listed the
        Nodes or failed to (marks are written meanwhile: a hub that may not list Nodes still serves)."""
        async with anyio.create_task_group() as tg:
            if self._watcher is not None:
                send, receive = anyio.create_memory_object_stream[WatchEvent](math.inf)
                tg.start_soon(self._consume, receive)
                tg.start_soon(self._watcher.watch, NODE_METADATA, send)
            await self._settled.wait()
            task_status.started()

    async def _consume(self, events: MemoryObjectReceiveStream[WatchEvent]) -> None:
        async with events:
            async for event in events:
                self.apply(event)

    def apply(self, event: WatchEvent) -> None:
        """One event of the Node watch. Never raises: a Node it cannot read is no longer known."""
        match event:
            case Relisted(objects=heads):
                if self._awaited:
                    for head in heads:
                        self._appeared(head.metadata.name)
                self._versions = {
                    head.metadata.name: sys.intern(version)
                    for head in heads
                    if (version := own_version(head.metadata.annotations, self._hub_id)) is not None
                }
                self._current = True
                self._settled.set()
            case Upserted(obj=obj):
                self._upserted(obj)
            case Deleted(obj=obj):
                self._forget(obj)
            case Invalid(name=name):
                self._versions.pop(name, None)
            case Interrupted():
                self._current = False
                self._settled.set()

    def _upserted(self, obj: RawObject) -> None:
        meta = self._meta(obj)
        if meta is None:
            return
        if self._awaited:
            self._appeared(meta.name)
        version = own_version(meta.annotations, self._hub_id)
        if version is None:
            self._versions.pop(meta.name, None)
        else:
            self._versions[meta.name] = sys.intern(version)

    def _appeared(self, node: str) -> None:
        for appeared in self._awaited.pop(node, ()):
            appeared.set()

    def _forget(self, obj: RawObject) -> None:
        meta = self._meta(obj)
        if meta is not None:
            self._versions.pop(meta.name, None)

    def _meta(self, obj: RawObject) -> NodeHeadMeta | None:
        try:
            return _META.decode(obj.metadata) if isinstance(obj.metadata, msgspec.Raw) else NodeHeadMeta()
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Never from a conforming API server. Which Node changed is not known: forget them all.
            self._log.warning("node_marks_forgotten", error=str(exc))
            self._versions.clear()
            return None
