"""The Node's ``Autonomy`` condition, written by the hub for its edges (which hold no API credentials).

An edge sends :class:`~nodetask.messages.AutonomyCondition` when its check (``nodetask.autonomy``)
changes the condition. The hub writes it on the Node's status only when status, reason or message
differ from what the Node says, keeping ``lastTransitionTime`` while the status stays the same, as
Kubernetes' own condition helpers do; each change of status also records an Event on the Node.

The write is a JSON merge patch of ``status.conditions`` conditional on the Node's resourceVersion
(retried on a conflict with the kubelet's own status updates), since a merge patch replaces the
list whole. (The hub's other Node writes, its session marks, are annotations: another resource
path, so there is no write to share.) Writes are per node, one at a time, newest first: a condition
sent while one is being written replaces any not yet begun. They belong to the hub, not to the
session, so one under way when its edge disconnects still lands.

An edge decides how often it sends its condition, and each write costs a read and a patch of the
Node, an Event when the status changes and, in turn, the controller's write of the approval label.
So the writes of one node begin at least ``interval`` seconds apart: a condition sent sooner waits,
replaced by any sent after it (coalesced, never dropped: the latest one is written when the interval
is over), so that an edge flapping its condition costs a bounded number of API writes a minute.
"""

from __future__ import annotations

import math
from typing import Final, Protocol

import anyio
import anyio.abc
import msgspec
import structlog

from nodetask.autonomy import CONDITION_TYPE
from nodetask.clock import Clock
from nodetask.messages import AutonomyCondition
from nodetask.names import clip
from nodetask.phases import ConditionStatus
from roles.cloud.api import NodeStore
from roles.cloud.metrics import HubMetrics
from roles.common.events import EventSink, object_event, record_event
from roles.kube import ApiError, Conflict
from roles.kube.resources import NODES
from schemas.core import NodeCondition
from schemas.meta import ObjectMeta

__all__ = ["AutonomyConditions", "ConditionApi", "condition_problem", "with_autonomy"]

Log = structlog.typing.FilteringBoundLogger

MAX_REASON: Final = 256
MAX_MESSAGE: Final = 16384
"""Longest message written (the edge already caps its list of errored keys)."""
ATTEMPTS: Final = 5
EVENT_COMPONENT: Final = "nodetaskd-cloud"
_EVENTS: Final = {
    ConditionStatus.TRUE: ("AutonomyEnabled", "Normal"),
    ConditionStatus.FALSE: ("AutonomyDisabled", "Normal"),
    ConditionStatus.UNKNOWN: ("AutonomyUnknown", "Warning"),
}


class ConditionApi(NodeStore, EventSink, Protocol):
    """What the writer needs: read a Node, merge-patch its status, create Events."""


def condition_problem(msg: AutonomyCondition) -> str:
    """Why ``msg`` cannot be written, or empty."""
    if msg.status not in set(ConditionStatus):
        return f"condition status must be True, False or Unknown, got {clip(msg.status, 64)!r}"
    if not msg.reason:
        return "condition reason is empty"
    return ""


def with_autonomy(
    conditions: tuple[NodeCondition, ...], *, status: str, reason: str, message: str, now: str
) -> tuple[NodeCondition, ...] | None:
    """``conditions`` with the Autonomy condition saying this; None when it already does. Pure.

    ``lastTransitionTime`` stays while the status does; ``lastHeartbeatTime`` is when it was written.
    """
    old = next((c for c in conditions if c.type == CONDITION_TYPE), None)
    if old is not None and (old.status, old.reason, old.message) == (status, reason, message):
        return None
    transition = old.last_transition_time if old is not None and old.status == status else now
    new = NodeCondition(
        type=CONDITION_TYPE,
        status=status,
        reason=reason,
        message=message,
        last_heartbeat_time=now,
        last_transition_time=transition,
    )
    if old is None:
        return (*conditions, new)
    return tuple(new if c is old else c for c in conditions)


class AutonomyConditions:
    """Writes the Autonomy conditions edges send; run with :meth:`run`, hand each with :meth:`submit`."""

    def __init__(self, api: ConditionApi, *, clock: Clock, metrics: HubMetrics, hub_id: str, interval: float) -> None:
        """``interval``: the fewest seconds between two writes of one node's condition (see the module docstring)."""
        self._api = api
        self._clock = clock
        self._metrics = metrics
        self._hub_id = hub_id
        self._interval = interval
        self._latest: dict[str, tuple[AutonomyCondition, Log]] = {}
        self._writing: set[str] = set()
        self._begun: dict[str, float] = {}
        """When each node's last write began (loop time); one entry per node that ever had a session."""
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the writes until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep_forever()

    def submit(self, node: str, condition: AutonomyCondition, log: Log) -> None:
        """Write ``condition`` on ``node``'s Node (after any write of it under way)."""
        assert self._tg is not None, "AutonomyConditions.run is not running"
        self._latest[node] = (condition, log)
        if node not in self._writing:
            self._writing.add(node)
            self._tg.start_soon(self._writer, node)

    async def _writer(self, node: str) -> None:
        try:
            while node in self._latest:
                wait = self._begun.get(node, -math.inf) + self._interval - anyio.current_time()
                if wait > 0:
                    await anyio.sleep(wait)  # what comes meanwhile replaces what waits
                    continue
                self._begun[node] = anyio.current_time()
                await self._write(node, *self._latest.pop(node))
        finally:
            self._writing.discard(node)

    async def _write(self, node: str, condition: AutonomyCondition, log: Log) -> None:
        reason, message = clip(condition.reason, MAX_REASON), clip(condition.message, MAX_MESSAGE)
        for _ in range(ATTEMPTS):
            try:
                current = await self._api.get(NODES, node)
                conditions = current.status.conditions
                now = self._clock.stamp()
                merged = with_autonomy(conditions, status=condition.status, reason=reason, message=message, now=now)
                if merged is None:
                    return
                patch = {
                    "metadata": {"resourceVersion": current.metadata.resource_version},
                    "status": {"conditions": msgspec.to_builtins(merged)},
                }
                await self._api.merge_patch(NODES, node, patch, subresource="status")
            except Conflict:
                continue
            except ApiError as exc:
                log.warning("autonomy_condition_not_written", status=condition.status, error=str(exc))
                return
            self._metrics.autonomy_conditions.labels(status=condition.status).inc()
            log.info("autonomy_condition_written", status=condition.status, reason=reason)
            old = next((c for c in conditions if c.type == CONDITION_TYPE), None)
            if old is None or old.status != condition.status:
                await self._record(
                    node, ConditionStatus(condition.status), reason=reason, message=message, now=now, log=log
                )
            return
        log.warning("autonomy_condition_not_written", status=condition.status, error=f"{ATTEMPTS} conflicts")

    async def _record(
        self, node: str, status: ConditionStatus, *, reason: str, message: str, now: str, log: Log
    ) -> None:
        event_reason, type_ = _EVENTS[status]
        text = f"Autonomy condition is {status.value}: {reason}" + (f": {message}" if message else "")
        event = object_event(
            api_version="v1",
            kind="Node",
            # kubectl describe node finds a Node's Events by a uid equal to its name (as the kubelet records them).
            meta=ObjectMeta(name=node, uid=node),
            reason=event_reason,
            message=clip(text, 1024),
            type_=type_,
            component=EVENT_COMPONENT,
            now=now,
        )
        with anyio.move_on_after(10):
            await record_event(self._api, event, log)
