"""The controller's decisions, as pure functions over immutable API objects.

Selecting nodes, initialising node entries, timing out silent nodes and deriving the job phase take
the job, the nodes and the time as arguments and return new values; :mod:`roles.controller.reconciler`
does the reading and writing. The controller owns ``status.phase``, ``status.reason``,
``status.nodeCounts``, the initial node entries and the Unknown verdict; it never touches what the
hubs own (a node entry's actions, versions and images after dispatch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import msgspec

from nodetask.clock import parse_time
from nodetask.job_phase import count_phases, job_phase
from nodetask.phases import JobPhase, NodeTaskPhase
from schemas import v1alpha2
from schemas.access import node_counts, targeting
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION, RETRY_ANNOTATION, Node
from schemas.kinds import NODE_UPGRADE_JOB, Kind

BOTH_SELECTORS: Final = "nodeNames and nodeSelector cannot be specified at the same time"
NO_SELECTOR: Final = "nodeNames and nodeSelector cannot both be empty"
NO_MATCH: Final = "no nodes were matched with selector"
NOT_EDGE: Final = "the node is not an edge node"
NOT_READY: Final = "the node is not ready"
TIMED_OUT: Final = "The node task has timed out"
NOT_CONNECTED: Final = "The node task has timed out: the node is not connected to any cloud hub"


def not_found(name: str) -> str:
    return f'failed to get node, err: nodes "{name}" not found'


def already_at(version: str, component: v1alpha2.NodeComponent = v1alpha2.NodeComponent.NODETASKD) -> str:
    if component is v1alpha2.NodeComponent.KUBELET:
        return f"the node's kubelet already runs version {version}"
    return f"the node already runs version {version}"


@dataclass(frozen=True, slots=True)
class UpgradeTarget:
    """What a NodeUpgradeJob installs: a node already running it is Successful at selection."""

    version: str
    component: v1alpha2.NodeComponent

    def reached_by(self, node: Node) -> bool:
        """Whether ``node`` runs it: the agent's version annotation, or the kubelet's own ``kubeletVersion``."""
        if self.component is v1alpha2.NodeComponent.KUBELET:
            info = node.status.node_info
            return info is not None and info.kubelet_version == self.version
        return node.metadata.annotations.get(AGENT_VERSION_ANNOTATION) == self.version


def upgrade_target(job: v1alpha2.NodeJob) -> UpgradeTarget | None:
    """The version an upgrade job installs, and on what; None for the other job types."""
    if isinstance(job, v1alpha2.NodeUpgradeJob) and job.spec.version:
        return UpgradeTarget(job.spec.version, job.spec.component)
    return None


class SelectionError(ValueError):
    """The job's node selection is invalid; the job fails with this reason."""


@dataclass(frozen=True, slots=True)
class Selected:
    """One node's initial entry: its phase (Pending, or a verdict reached at selection) and reason."""

    name: str
    phase: NodeTaskPhase
    reason: str = ""


def select_nodes(job: v1alpha2.NodeJob, nodes: Mapping[str, Node]) -> list[Selected]:
    """The job's nodes, in spec order (names deduplicated) or in name order for a selector.

    Errors:
        :class:`SelectionError` with KubeEdge's texts when both or neither of nodeNames and
        labelSelector are given, or the selector matches nothing.
    """
    t = targeting(job)
    if t.node_names and t.label_selector is not None:
        raise SelectionError(BOTH_SELECTORS)
    if not t.node_names and t.label_selector is None:
        raise SelectionError(NO_SELECTOR)
    if t.label_selector is not None:
        selector = t.label_selector
        names = sorted(n for n, node in nodes.items() if selector.matches(node.metadata.labels))
        if not names:
            raise SelectionError(NO_MATCH)
    else:
        names = list(dict.fromkeys(t.node_names))
    target = upgrade_target(job)
    return [verdict(name, nodes.get(name), target) for name in names]


def verdict(name: str, node: Node | None, target: UpgradeTarget | None) -> Selected:
    """A selected node's initial entry: Failure if it is gone, not an edge or not ready; Successful if
    it already runs an upgrade's ``target``; else Pending."""
    if node is None:
        return Selected(name, NodeTaskPhase.FAILURE, not_found(name))
    if not node.is_edge:
        return Selected(name, NodeTaskPhase.FAILURE, NOT_EDGE)
    if not node.is_ready:
        return Selected(name, NodeTaskPhase.FAILURE, NOT_READY)
    if target is not None and target.reached_by(node):
        return Selected(name, NodeTaskPhase.SUCCESSFUL, already_at(target.version, target.component))
    return Selected(name, NodeTaskPhase.PENDING)


def initial_status(kind: Kind, job: v1alpha2.NodeJob, nodes: Mapping[str, Node]) -> v1alpha2.NodeJobStatus:
    """The status written when a job is first seen: Init with one entry per node, or Failure."""
    try:
        selected = select_nodes(job, nodes)
    except SelectionError as exc:
        return msgspec.structs.replace(
            job.status, phase=JobPhase.FAILURE, reason=str(exc), node_status=(), retry=_handled_at_creation(job)
        )
    entries = tuple(kind.node_status_type(node_name=s.name, phase=s.phase, reason=s.reason) for s in selected)
    return msgspec.structs.replace(
        job.status,
        phase=JobPhase.INIT,
        reason="",
        node_status=entries,
        node_counts=node_counts(entries),
        retry=_handled_at_creation(job),
    )


def _handled_at_creation(job: v1alpha2.NodeJob) -> v1alpha2.RetryStatus | None:
    # A retry value the job was created with (a manifest copied from a retried job) asks for nothing.
    value = job.metadata.annotations.get(RETRY_ANNOTATION)
    return job.status.retry if value is None else v1alpha2.RetryStatus(handled=value)


def is_final(kind: Kind, phase: JobPhase) -> bool:
    """KubeEdge: a NodeUpgradeJob is final only when Completed (a Failure may still recover)."""
    if kind is NODE_UPGRADE_JOB:
        return phase is JobPhase.COMPLETED
    return phase in (JobPhase.COMPLETED, JobPhase.FAILURE)


def deadline(
    job: v1alpha2.NodeJob, entry: v1alpha2.NodeTaskStatus, *, connected: Callable[[str], bool]
) -> datetime | None:
    """When ``entry`` times out, or None if it cannot (ended, or queued on a connected node).

    A dispatched node has ``timeoutSeconds`` from its dispatch (KubeEdge: from its last report or
    the job's creation, which times out nodes merely queued behind a small concurrency). A Pending
    node times out only while no hub holds its session, counting from the job's creation (from its
    retry, for a retried node).
    """
    timeout = timedelta(seconds=targeting(job).effective_timeout)
    run_start = _run_start(job, entry)
    if entry.phase is NodeTaskPhase.IN_PROGRESS:
        start = entry.dispatch_time or (entry.action_flow[-1].time if entry.action_flow else "")
        start = start or run_start
    elif entry.phase in (NodeTaskPhase.PENDING, NodeTaskPhase.NONE) and not connected(entry.node_name):
        start = run_start
    else:
        return None
    try:
        return parse_time(start) + timeout
    except ValueError:
        # A foreign writer's unparsable time must not stop the sweep (KubeEdge's ticker dies here).
        return parse_time(job.metadata.creation_timestamp) + timeout if job.metadata.creation_timestamp else None


def _run_start(job: v1alpha2.NodeJob, entry: v1alpha2.NodeTaskStatus) -> str:
    """When ``entry``'s attempt began: its retry's time for a retried node, else the job's creation."""
    retry = job.status.retry
    if entry.attempt > 1 and retry is not None and retry.time:
        return retry.time
    return job.metadata.creation_timestamp


def next_status(
    kind: Kind, job: v1alpha2.NodeJob, *, now: datetime, connected: Callable[[str], bool]
) -> v1alpha2.NodeJobStatus | None:
    """The status after timing out silent nodes and recomputing the phase; None if nothing changes."""
    status = job.status
    entries: tuple[v1alpha2.NodeTaskStatus, ...] = status.node_status
    if not entries:
        # A job that selected no node failed at selection; keep that reason (KubeEdge clears it).
        return None
    if status.phase in (JobPhase.INIT, JobPhase.IN_PROGRESS):
        entries = tuple(_timed_out(job, e, now=now, connected=connected) for e in entries)
    verdict = job_phase(count_phases(e.phase for e in entries), targeting(job).failure_tolerate)
    new = msgspec.structs.replace(
        status, node_status=entries, phase=verdict.phase, reason=verdict.reason, node_counts=node_counts(entries)
    )
    return None if new == status else new


def _timed_out(
    job: v1alpha2.NodeJob, entry: v1alpha2.NodeTaskStatus, *, now: datetime, connected: Callable[[str], bool]
) -> v1alpha2.NodeTaskStatus:
    due = deadline(job, entry, connected=connected)
    if due is None or now < due:
        return entry
    reason = TIMED_OUT if entry.phase is NodeTaskPhase.IN_PROGRESS else NOT_CONNECTED
    return msgspec.structs.replace(entry, phase=NodeTaskPhase.UNKNOWN, reason=reason)


def next_deadline(job: v1alpha2.NodeJob, *, connected: Callable[[str], bool]) -> datetime | None:
    """The earliest time a node of ``job`` may time out, to wake the job's worker then."""
    if job.status.phase not in (JobPhase.INIT, JobPhase.IN_PROGRESS):
        return None
    due = [d for e in job.status.node_status if (d := deadline(job, e, connected=connected)) is not None]
    return min(due, default=None)


def hub_of(node: Node | None) -> str:
    """The hub instance holding ``node``'s session, or empty."""
    return node.metadata.annotations.get(HUB_ANNOTATION, "") if node is not None else ""


@dataclass(frozen=True, slots=True)
class Notice:
    """A Kubernetes Event to record on the job."""

    type: str
    reason: str
    message: str


def notices(old: v1alpha2.NodeJobStatus, new: v1alpha2.NodeJobStatus) -> list[Notice]:
    """Events telling the story of a status change: job phase transitions, nodes failing or timing out."""
    out: list[Notice] = []
    before = {e.node_name: e for e in old.node_status}
    for entry in new.node_status:
        prev = before.get(entry.node_name)
        if prev is not None and prev.phase is entry.phase:
            continue
        if entry.phase is NodeTaskPhase.FAILURE:
            out.append(Notice("Warning", "NodeTaskFailed", f"node {entry.node_name}: {entry.reason}"))
        elif entry.phase is NodeTaskPhase.UNKNOWN:
            out.append(Notice("Warning", "NodeTaskTimedOut", f"node {entry.node_name}: {entry.reason}"))
    if new.phase is not old.phase:
        kind = "Warning" if new.phase is JobPhase.FAILURE else "Normal"
        message = f"job phase {old.phase or 'New'} -> {new.phase}" + (f": {new.reason}" if new.reason else "")
        out.append(Notice(kind, f"Job{new.phase}", message))
    return out
