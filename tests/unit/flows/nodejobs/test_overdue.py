"""A job is overdue once it runs past the nodes' timeouts its concurrency allows, from its start or retry."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from flows.nodejobs.overdue import latest_end, overdue
from nodetask.clock import format_time
from nodetask.phases import JobPhase, NodeTaskPhase
from schemas import v1alpha2
from schemas.meta import ObjectMeta

CREATED = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _job(
    nodes: int,
    *,
    concurrency: int = 0,
    timeout: int | None = 60,
    phase: JobPhase = JobPhase.IN_PROGRESS,
    retried: datetime | None = None,
    created: str = format_time(CREATED),
) -> v1alpha2.ImagePrePullJob:
    entries = tuple(
        v1alpha2.ImagePrePullNodeTaskStatus(node_name=f"n{i}", phase=NodeTaskPhase.PENDING) for i in range(nodes)
    )
    retry = v1alpha2.RetryStatus(handled="1", attempt=2, time=format_time(retried)) if retried else None
    template = v1alpha2.ImagePrePullTemplate(images=("a:1",), concurrency=concurrency, timeout_seconds=timeout)
    return v1alpha2.ImagePrePullJob(
        metadata=ObjectMeta(name="j", creation_timestamp=created),
        spec=v1alpha2.ImagePrePullJobSpec(image_pre_pull_template=template),
        status=v1alpha2.ImagePrePullJobStatus(phase=phase, node_status=entries, retry=retry),
    )


@given(nodes=st.integers(1, 500), concurrency=st.integers(0, 50), timeout=st.integers(1, 3600))
def test_a_running_job_is_overdue_just_past_its_waves_of_timeouts(nodes: int, concurrency: int, timeout: int) -> None:
    """ceil(nodes / concurrency) timeouts after its creation (one, with no concurrency limit), and not before."""
    job = _job(nodes, concurrency=concurrency, timeout=timeout)
    waves = math.ceil(nodes / concurrency) if concurrency else 1
    end = CREATED + timedelta(seconds=waves * timeout)
    assert latest_end(job) == end
    assert not overdue(job, end)
    assert overdue(job, end + timedelta(seconds=1))


def test_a_retry_starts_the_clock_again_and_an_ended_job_is_never_overdue() -> None:
    """From the latest retry's time; Completed and Failure jobs are not waiting on anything."""
    later = CREATED + timedelta(hours=5)
    assert latest_end(_job(3, retried=later)) == later + timedelta(seconds=60)
    far = CREATED + timedelta(days=30)
    assert not overdue(_job(3, phase=JobPhase.COMPLETED), far)
    assert not overdue(_job(3, phase=JobPhase.FAILURE), far)
    assert overdue(_job(3, phase=JobPhase.INIT), far)


def test_the_default_timeout_applies_and_a_job_without_a_start_time_is_not_judged() -> None:
    """No timeoutSeconds means the default; an unparsable creation time gives no end rather than an error."""
    default_end = latest_end(_job(1, timeout=None))
    assert default_end is not None
    assert default_end > CREATED
    assert latest_end(_job(1, created="yesterday")) is None
    assert not overdue(_job(1, created=""), CREATED + timedelta(days=365))
