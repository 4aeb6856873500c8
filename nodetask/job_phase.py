"""Job phase from node phases: KubeEdge's ``CalculatePhaseWithCounts``, with exact arithmetic.

Pure functions only. The tolerance arrives already parsed and bounded (the API types validate
``failureTolerate`` when a job is decoded), so nothing here can silently fall back to a default.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from nodetask.phases import JobPhase, NodeTaskPhase

__all__ = ["PhaseCounts", "PhaseVerdict", "count_phases", "failure_ratio", "job_phase"]

_DIVISION_PLACES = Decimal("1e-16")  # shopspring/decimal's DivisionPrecision
_RATIO_PLACES = Decimal("0.01")


@dataclass(frozen=True, slots=True)
class PhaseCounts:
    """How many node tasks are in each phase."""

    pending: int = 0
    in_progress: int = 0
    successful: int = 0
    failure: int = 0
    unknown: int = 0
    unset: int = 0
    """Entries with an empty phase; KubeEdge counts them as still processing."""

    @property
    def total(self) -> int:
        return self.pending + self.in_progress + self.successful + self.failure + self.unknown + self.unset

    @property
    def processing(self) -> int:
        """Nodes that have not ended: Pending, InProgress and unset."""
        return self.pending + self.in_progress + self.unset

    @property
    def failed(self) -> int:
        """Nodes counted against the tolerance: Failure and Unknown."""
        return self.failure + self.unknown


def count_phases(phases: Iterable[NodeTaskPhase]) -> PhaseCounts:
    """Tally node phases."""
    tally = dict.fromkeys(NodeTaskPhase, 0)
    for phase in phases:
        tally[phase] += 1
    return PhaseCounts(
        pending=tally[NodeTaskPhase.PENDING],
        in_progress=tally[NodeTaskPhase.IN_PROGRESS],
        successful=tally[NodeTaskPhase.SUCCESSFUL],
        failure=tally[NodeTaskPhase.FAILURE],
        unknown=tally[NodeTaskPhase.UNKNOWN],
        unset=tally[NodeTaskPhase.NONE],
    )


def failure_ratio(failed: int, total: int) -> Decimal:
    """``failed / total`` rounded as KubeEdge does: 16 places, then 2, both half away from zero."""
    ratio = (Decimal(failed) / Decimal(total)).quantize(_DIVISION_PLACES, rounding=ROUND_HALF_UP)
    return ratio.quantize(_RATIO_PLACES, rounding=ROUND_HALF_UP)


@dataclass(frozen=True, slots=True)
class PhaseVerdict:
    """The job phase and the reason to record with it (empty clears the reason)."""

    phase: JobPhase
    reason: str = ""


def job_phase(counts: PhaseCounts, tolerance: Decimal | None) -> PhaseVerdict:
    """The job phase for ``counts`` given ``failureTolerate`` (None: KubeEdge's default, 0).

    No nodes at all is a failure; any node still processing keeps the job in progress; otherwise the
    job fails when the rounded failure ratio strictly exceeds the tolerance.
    """
    total = counts.total
    if total == 0:
        return PhaseVerdict(JobPhase.FAILURE, "no node task to run")
    if counts.processing > 0:
        return PhaseVerdict(JobPhase.IN_PROGRESS)
    failed = counts.failed
    if failed > 0 and failure_ratio(failed, total) > (tolerance or Decimal(0)):
        return PhaseVerdict(
            JobPhase.FAILURE,
            f"the number of failed nodes is {failed}/{total}, which exceeds the failure tolerance threshold",
        )
    return PhaseVerdict(JobPhase.COMPLETED)
