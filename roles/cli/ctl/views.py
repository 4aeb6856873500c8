"""What the operator's CLI shows, computed from API objects: pure functions over immutable data.

A job becomes a :class:`JobSummary` (phase and node counts per phase), its nodes
:class:`NodeRow` s (with the hub and agent version the hubs record on each Node), an edge Node an
:class:`EdgeRow`, an Event an :class:`EventRow`. The I/O (``roles.cli.ctl.commands``) only fetches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

import msgspec

from flows.nodejobs.nodeupgradejob import WAITING_CONFIRMATION
from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase
from schemas import v1alpha2
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION, Event, Node
from schemas.kinds import KINDS, NODE_UPGRADE_JOB, Kind

__all__ = [
    "COUNT_KEYS",
    "EdgeRow",
    "EventRow",
    "JobSummary",
    "NodeRow",
    "Row",
    "age",
    "confirm_value",
    "confirmable",
    "edge_rows",
    "event_rows",
    "find_kind",
    "node_rows",
    "paused_for_confirmation",
    "retry_value",
    "summarize",
]

COUNT_KEYS: Final = ("pending", "inProgress", "successful", "failure", "unknown")
"""``status.nodeCounts`` keys, in the order a node goes through them."""
_PHASE_KEY: Final = {
    NodeTaskPhase.NONE: "pending",
    NodeTaskPhase.PENDING: "pending",
    NodeTaskPhase.IN_PROGRESS: "inProgress",
    NodeTaskPhase.SUCCESSFUL: "successful",
    NodeTaskPhase.FAILURE: "failure",
    NodeTaskPhase.UNKNOWN: "unknown",
}
_COUNT_ATTRIBUTES: Final = {
    "pending": "pending",
    "inProgress": "in_progress",
    "successful": "successful",
    "failure": "failure",
    "unknown": "unknown",
}
FINAL: Final = frozenset({JobPhase.COMPLETED, JobPhase.FAILURE})


class Row(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Rows are encoded as they are for ``-o json|yaml``."""


class JobSummary(Row, frozen=True):
    kind: str
    """The kind's singular, lower case (``nodeupgradejob``), as ``kubectl`` names it."""
    name: str
    phase: str
    reason: str = ""
    total: int = 0
    counts: dict[str, int] = {}
    """Nodes per phase, by :data:`COUNT_KEYS`."""
    created: str = ""
    target: str = ""
    """What the job does, in a few words (``-o wide``): an upgrade's component and version, a pre-pull's images,
    a config update's fields."""

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def final(self) -> bool:
        return self.phase in FINAL

    @property
    def ended(self) -> int:
        """Nodes whose task has ended, whatever the outcome."""
        return sum(self.counts.get(key, 0) for key in ("successful", "failure", "unknown"))


class NodeRow(Row, frozen=True):
    node: str
    phase: str
    last_action: str = ""
    last_action_status: str = ""
    reason: str = ""
    dispatched: str = ""
    hub: str = ""
    agent_version: str = ""


class EdgeRow(Row, frozen=True):
    name: str
    hub: str
    agent_version: str
    connected: bool
    ready: bool


class EventRow(Row, frozen=True):
    time: str
    type: str
    reason: str
    message: str
    object: str = ""
    count: int = 1


def find_kind(text: str) -> Kind:
    """The node-job kind ``text`` names: its plural, singular, kind or a short name, any case.

    Errors: :class:`ValueError` naming the known names.
    """
    wanted = text.lower()
    for kind in KINDS:
        if wanted in (kind.plural, kind.singular, kind.kind.lower(), *kind.short_names):
            return kind
    known = ", ".join(name for kind in KINDS for name in (kind.singular, *kind.short_names))
    raise ValueError(f"{text!r} is not a node job kind (one of {known})")


def summarize(kind: Kind, job: Any) -> JobSummary:
    """A job of ``kind`` (its v1alpha2 object) as a summary; counts from ``status.nodeCounts`` when the
    controller has written them, else counted from ``status.nodeStatus``."""
    status = job.status
    counted = status.node_counts
    if counted is not None:
        counts = {key: getattr(counted, attribute) for key, attribute in _COUNT_ATTRIBUTES.items()}
        total = counted.total
    else:
        by_phase = Counter(_PHASE_KEY[entry.phase] for entry in status.node_status)
        counts = {key: by_phase.get(key, 0) for key in COUNT_KEYS}
        total = len(status.node_status)
    return JobSummary(
        kind=kind.singular,
        name=job.metadata.name,
        phase=str(status.phase),
        reason=status.reason,
        total=total,
        counts=counts,
        created=job.metadata.creation_timestamp,
        target=target_of(job.spec),
    )


def target_of(spec: Any) -> str:
    """What a job's ``spec`` does, in a few words: ``kubelet v1.20.3``, ``2 images: a:1, b:2``, ``maxPods``."""
    if isinstance(spec, v1alpha2.NodeUpgradeJobSpec):
        return f"{spec.component} {spec.version}"
    if isinstance(spec, v1alpha2.ImagePrePullJobSpec):
        images = spec.image_pre_pull_template.images
        return f"{len(images)} image{'' if len(images) == 1 else 's'}: {', '.join(images)}"
    if isinstance(spec, v1alpha2.ConfigUpdateJobSpec):
        return f"{spec.component}: {', '.join(sorted(spec.update_fields))}"
    return ""


def node_rows(job: Any, nodes: Mapping[str, Node]) -> list[NodeRow]:
    """One row per node of ``job``, with the hub and agent version recorded on its Node (if any)."""
    rows = []
    for entry in job.status.node_status:
        last = entry.action_flow[-1] if entry.action_flow else None
        annotations = nodes[entry.node_name].metadata.annotations if entry.node_name in nodes else {}
        rows.append(
            NodeRow(
                node=entry.node_name,
                phase=str(entry.phase) or "Pending",
                last_action=last.action if last else "",
                last_action_status=str(last.status) if last else "",
                reason=entry.reason or (last.reason if last else ""),
                dispatched=entry.dispatch_time,
                hub=annotations.get(HUB_ANNOTATION, ""),
                agent_version=annotations.get(AGENT_VERSION_ANNOTATION, ""),
            )
        )
    return rows


def edge_rows(nodes: Iterable[Node]) -> list[EdgeRow]:
    """The edge Nodes (KubeEdge's role label), each with the hub holding its session, if one does."""
    return [
        EdgeRow(
            name=node.metadata.name,
            hub=node.metadata.annotations.get(HUB_ANNOTATION, ""),
            agent_version=node.metadata.annotations.get(AGENT_VERSION_ANNOTATION, ""),
            connected=bool(node.metadata.annotations.get(HUB_ANNOTATION)),
            ready=node.is_ready,
        )
        for node in sorted(nodes, key=lambda n: n.metadata.name)
        if node.is_edge
    ]


def event_rows(events: Iterable[Event], *, limit: int) -> list[EventRow]:
    """The latest ``limit`` Events, oldest first."""

    def when(event: Event) -> str:
        return event.last_timestamp or event.first_timestamp or event.metadata.creation_timestamp

    latest = sorted(events, key=when)[-limit:] if limit > 0 else []
    return [
        EventRow(
            time=when(e),
            type=e.type or "Normal",
            reason=e.reason,
            message=e.message,
            object=f"{e.involved_object.kind.lower()}/{e.involved_object.name}",
            count=e.count,
        )
        for e in latest
    ]


def confirm_value(current: str, nodes: Iterable[str], *, every: bool) -> str:
    """The confirm annotation after releasing ``nodes`` (or every node): what was there, plus them.

    ``*`` stays ``*``: every node is released already.
    """
    names = {n.strip() for n in current.split(",") if n.strip()}
    if every or "*" in names:
        return "*"
    return ",".join(sorted(names | set(nodes)))


def retry_value(current: str | None, handled: str) -> str:
    """A retry annotation value the controller has not handled: the current number plus one (``1`` when it
    holds none), past ``handled`` and ``current`` both.

    Any new value asks for one retry; a counter keeps ``kubectl get -o yaml`` telling how many were asked for.
    """
    number = int(current) + 1 if current is not None and current.isdecimal() else 1
    while str(number) in (current, handled):
        number += 1
    return str(number)


def confirmable(kind: Kind) -> bool:
    """Whether jobs of ``kind`` can wait for a confirmation (NodeUpgradeJobs: ``requireConfirmation``)."""
    return kind is NODE_UPGRADE_JOB


def age(created: str, now: datetime) -> str:
    """``kubectl``'s short age (``42s``, ``7m``, ``3h``, ``12d``) of an RFC 3339 time; ``-`` if absent."""
    if not created:
        return "-"
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def paused_for_confirmation(job: Any) -> list[str]:
    """The nodes of ``job`` paused at WaitingConfirmation: in progress, that action reported done."""
    paused = []
    for entry in job.status.node_status:
        last = entry.action_flow[-1] if entry.action_flow else None
        if (
            entry.phase is NodeTaskPhase.IN_PROGRESS
            and last is not None
            and last.action == WAITING_CONFIRMATION
            and last.status is ConditionStatus.TRUE
        ):
            paused.append(entry.node_name)
    return paused
