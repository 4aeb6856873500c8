"""Job phase maths equals KubeEdge's CalculatePhaseWithCounts, test vectors included."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodetask.job_phase import PhaseCounts, count_phases, failure_ratio, job_phase
from nodetask.phases import JobPhase, NodeTaskPhase

S, F, U, P, R = (
    NodeTaskPhase.SUCCESSFUL,
    NodeTaskPhase.FAILURE,
    NodeTaskPhase.UNKNOWN,
    NodeTaskPhase.PENDING,
    NodeTaskPhase.IN_PROGRESS,
)


def _counts(total: int, processing: int, failed: int) -> PhaseCounts:
    return PhaseCounts(in_progress=processing, failure=failed, successful=total - processing - failed)


@pytest.mark.parametrize(
    ("total", "processing", "failed", "tolerance", "phase"),
    [
        (0, 0, 0, None, JobPhase.FAILURE),
        (10, 1, 0, None, JobPhase.IN_PROGRESS),
        (10, 0, 1, None, JobPhase.FAILURE),
        (10, 0, 5, Decimal("0.5"), JobPhase.COMPLETED),
        (10, 0, 6, Decimal("0.5"), JobPhase.FAILURE),
        (10, 0, 0, None, JobPhase.COMPLETED),
    ],
)
def test_kubeedge_calculation_vectors(
    total: int, processing: int, failed: int, tolerance: Decimal | None, phase: JobPhase
) -> None:
    """The vectors of KubeEdge's calculation_test.go give the same phases."""
    assert job_phase(_counts(total, processing, failed), tolerance).phase is phase


@pytest.mark.parametrize(
    ("phases", "expected"),
    [([U, S, F], JobPhase.FAILURE), ([S, S, F], JobPhase.COMPLETED), ([R, S, F], JobPhase.IN_PROGRESS)],
)
def test_kubeedge_handler_vectors(phases: list[NodeTaskPhase], expected: JobPhase) -> None:
    """KubeEdge's handler tests with tolerance 0.5: Unknown counts as failed, InProgress keeps the job running."""
    assert job_phase(count_phases(phases), Decimal("0.5")).phase is expected


def test_failure_reason_text_is_kubeedges() -> None:
    """A failed job's reason is KubeEdge's sentence; other phases clear it."""
    verdict = job_phase(count_phases([U, S, F]), Decimal("0.5"))
    assert verdict.reason == "the number of failed nodes is 2/3, which exceeds the failure tolerance threshold"
    assert job_phase(count_phases([S, S, F]), Decimal("0.5")).reason == ""


def test_ratio_rounds_half_up_to_two_places() -> None:
    """1/8 = 0.125 rounds to 0.13 (half away from zero), so 0.12 is exceeded and 0.13 is not."""
    assert failure_ratio(1, 8) == Decimal("0.13")
    assert job_phase(_counts(8, 0, 1), Decimal("0.12")).phase is JobPhase.FAILURE
    assert job_phase(_counts(8, 0, 1), Decimal("0.13")).phase is JobPhase.COMPLETED


def test_one_failure_in_more_than_200_nodes_rounds_to_zero_as_in_kubeedge() -> None:
    """KubeEdge's 2-place rounding makes 1/201 = 0.00, which does not exceed a tolerance of 0."""
    assert failure_ratio(1, 201) == Decimal("0.00")
    assert job_phase(_counts(201, 0, 1), None).phase is JobPhase.COMPLETED
    assert job_phase(_counts(200, 0, 1), None).phase is JobPhase.FAILURE


def test_pending_and_unset_phases_count_as_processing() -> None:
    """Pending and empty phases keep the job InProgress, as in KubeEdge (Init becomes InProgress)."""
    assert job_phase(count_phases([P, S]), None).phase is JobPhase.IN_PROGRESS
    assert job_phase(count_phases([NodeTaskPhase.NONE]), None).phase is JobPhase.IN_PROGRESS


tolerances = st.decimals(min_value=0, max_value=1, places=2)


@given(st.integers(1, 500), st.data(), tolerances)
def test_more_failures_never_turn_failure_into_completed(total: int, data: st.DataObject, tol: Decimal) -> None:
    """With all nodes done, the phase is monotone in the number of failed nodes."""
    failed = data.draw(st.integers(0, total - 1))
    before = job_phase(_counts(total, 0, failed), tol).phase
    after = job_phase(_counts(total, 0, failed + 1), tol).phase
    if before is JobPhase.FAILURE:
        assert after is JobPhase.FAILURE


@given(st.integers(1, 500), st.data(), tolerances)
def test_any_processing_node_means_in_progress(total: int, data: st.DataObject, tol: Decimal) -> None:
    """Whatever the failures, a job with a node still processing is InProgress."""
    processing = data.draw(st.integers(1, total))
    failed = data.draw(st.integers(0, total - processing))
    assert job_phase(_counts(total, processing, failed), tol).phase is JobPhase.IN_PROGRESS


@given(st.lists(st.sampled_from(list(NodeTaskPhase)), max_size=50))
def test_counts_add_up(phases: list[NodeTaskPhase]) -> None:
    """Every node is counted once, in exactly one bucket."""
    counts = count_phases(phases)
    assert counts.total == len(phases)
    assert counts.processing + counts.failed + counts.successful == len(phases)
