"""Kind-independent views of a node job: which nodes it targets and its execution limits.

ImagePrePullJob nests these fields under ``spec.imagePrePullTemplate``; the other kinds keep them in
``spec``. Code that works on every kind reads them through :func:`targeting`, and counts a job's
nodes by phase with :func:`node_counts` and :func:`counted` (the controller and the hubs both
keep ``nodeCounts``).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Final, TypeVar

import msgspec

from nodetask.job_phase import count_phases
from schemas import v1alpha2
from schemas.meta import LabelSelector, parse_tolerance

J = TypeVar("J", bound=v1alpha2.NodeJob)

DEFAULT_TIMEOUT_SECONDS: Final = 300
"""KubeEdge's documented default (``0`` also means the default)."""
DEFAULT_CONCURRENCY: Final = 1


@dataclass(frozen=True, slots=True)
class Targeting:
    """What every kind says about where and how its node tasks run."""

    node_names: tuple[str, ...]
    label_selector: LabelSelector | None
    concurrency: int
    timeout_seconds: int | None
    failure_tolerate: Decimal | None

    @property
    def effective_concurrency(self) -> int:
        return self.concurrency if self.concurrency > 0 else DEFAULT_CONCURRENCY

    @property
    def effective_timeout(self) -> int:
        return self.timeout_seconds or DEFAULT_TIMEOUT_SECONDS


def targeting(job: v1alpha2.NodeJob) -> Targeting:
    """The targeting fields of any v1alpha2 node job."""
    spec: v1alpha2.NodeUpgradeJobSpec | v1alpha2.ImagePrePullTemplate | v1alpha2.ConfigUpdateJobSpec
    spec = job.spec.image_pre_pull_template if isinstance(job, v1alpha2.ImagePrePullJob) else job.spec
    return Targeting(
        node_names=spec.node_names,
        label_selector=spec.label_selector,
        concurrency=spec.concurrency,
        timeout_seconds=spec.timeout_seconds,
        failure_tolerate=parse_tolerance(spec.failure_tolerate),
    )


def node_counts(entries: tuple[v1alpha2.NodeTaskStatus, ...]) -> v1alpha2.NodeCounts:
    """``status.nodeCounts`` for these node entries (entries with no phase yet count as pending)."""
    c = count_phases(e.phase for e in entries)
    return v1alpha2.NodeCounts(
        total=c.total,
        pending=c.pending + c.unset,
        in_progress=c.in_progress,
        successful=c.successful,
        failure=c.failure,
        unknown=c.unknown,
    )


def counted(job: J) -> J:
    """``job`` with ``nodeCounts`` matching its entries; the same object when they already do.

    The controller writes the counts when a job's phase moves, and the hubs with every batch they
    write; finding them right after a hub write, the controller has nothing to write.
    """
    counts = node_counts(job.status.node_status)
    if counts == job.status.node_counts:
        return job
    new: J = msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, node_counts=counts))
    return new
