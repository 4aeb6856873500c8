"""The controller's retry decision (flows.nodejobs.retry): which nodes run again and the status it writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from flows.nodejobs import decide
from flows.nodejobs.retry import announced, pending_event, retried
from nodetask.clock import format_time
from nodetask.names import event_name
from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase
from schemas import v1alpha2
from schemas.core import AGENT_VERSION_ANNOTATION, EDGE_ROLE_LABEL, RETRY_ANNOTATION, Node, NodeCondition, NodeStatus
from schemas.kinds import IMAGE_PRE_PULL_JOB, NODE_UPGRADE_JOB
from schemas.meta import ObjectMeta
from schemas.retry import RETRIABLE_NODE_PHASES

CREATED = "2026-11-25T10:00:00Z"
NOW = datetime(2026, 11, 25, 11, 0, tzinfo=UTC)


def node(name: str, *, ready: bool = True, version: str = "") -> Node:
    return Node(
        metadata=ObjectMeta(
            name=name,
            labels={EDGE_ROLE_LABEL: ""},
            annotations={AGENT_VERSION_ANNOTATION: version} if version else {},
        ),
        status=NodeStatus(conditions=(NodeCondition(type="Ready", status="True" if ready else "False"),)),
    )


def entry(name: str, phase: NodeTaskPhase, **fields: object) -> v1alpha2.ImagePrePullNodeTaskStatus:
    return v1alpha2.ImagePrePullNodeTaskStatus(node_name=name, phase=phase, **fields)  # type: ignore[arg-type]


def prepull(
    entries: tuple[v1alpha2.ImagePrePullNodeTaskStatus, ...],
    *,
    phase: JobPhase = JobPhase.FAILURE,
    retry_value: str | None = "1",
    handled: v1alpha2.RetryStatus | None = None,
    tolerate: str | None = None,
) -> v1alpha2.ImagePrePullJob:
    annotations = {RETRY_ANNOTATION: retry_value} if retry_value is not None else {}
    template = v1alpha2.ImagePrePullTemplate(
        images=("busybox:1",), node_names=tuple(e.node_name for e in entries), failure_tolerate=tolerate
    )
    return v1alpha2.ImagePrePullJob(
        metadata=ObjectMeta(name="pp", uid="u1", creation_timestamp=CREATED, annotations=annotations),
        spec=v1alpha2.ImagePrePullJobSpec(image_pre_pull_template=template),
        status=v1alpha2.ImagePrePullJobStatus(phase=phase, node_status=entries, retry=handled),
    )


PULL_FAILED = v1alpha2.ActionStatus(
    action="Pull", status=ConditionStatus.FALSE, reason="not found", time="2026-11-25T10:05:00Z"
)


def test_failed_and_silent_nodes_go_back_to_pending_keeping_their_previous_attempt() -> None:
    """Failure and Unknown nodes restart at attempt 2 with how attempt 1 ended; Successful ones stay."""
    done = entry("ok", NodeTaskPhase.SUCCESSFUL, action_flow=(PULL_FAILED,))
    failed = entry("bad", NodeTaskPhase.FAILURE, reason="not found", action_flow=(PULL_FAILED,), dispatch_time="x")
    silent = entry("mute", NodeTaskPhase.UNKNOWN, reason=decide.TIMED_OUT, dispatch_time="2026-11-25T10:01:00Z")
    job = prepull((done, failed, silent))
    nodes = {n: node(n) for n in ("ok", "bad", "mute")}

    outcome = retried(IMAGE_PRE_PULL_JOB, job, nodes, now=NOW)

    assert outcome is not None
    assert not outcome.refusal
    status = outcome.status
    assert status.phase is JobPhase.IN_PROGRESS
    assert status.retry is not None
    assert msgspec.structs.replace(status.retry, pending_event=None) == v1alpha2.RetryStatus(
        handled="1", attempt=2, time=format_time(NOW), nodes=2
    )
    kept, bad, mute = status.node_status
    assert kept is done
    assert (bad.phase, bad.attempt, bad.reason, bad.action_flow, bad.dispatch_time) == (
        NodeTaskPhase.PENDING,
        2,
        "",
        (),
        "",
    )
    assert bad.previous_attempt == v1alpha2.PreviousAttempt(
        attempt=1, phase=NodeTaskPhase.FAILURE, action="Pull", reason="not found", time="2026-11-25T10:05:00Z"
    )
    assert mute.previous_attempt == v1alpha2.PreviousAttempt(
        attempt=1, phase=NodeTaskPhase.UNKNOWN, reason=decide.TIMED_OUT, time="2026-11-25T10:01:00Z"
    )
    assert status.node_counts == v1alpha2.NodeCounts(total=3, pending=2, successful=1)
    assert outcome.notice() == decide.Notice("Normal", "JobRetried", "attempt 2: 2 nodes run again (bad, mute)")


def test_retried_nodes_are_judged_again_as_on_a_first_run() -> None:
    """A retried node now gone or not ready fails at once; an upgrade's node already at the version succeeds."""
    entries = tuple(
        v1alpha2.NodeUpgradeJobNodeTaskStatus(node_name=n, phase=NodeTaskPhase.FAILURE, reason="boom")
        for n in ("gone", "down", "there", "runs")
    )
    job = v1alpha2.NodeUpgradeJob(
        metadata=ObjectMeta(name="up", uid="u", creation_timestamp=CREATED, annotations={RETRY_ANNOTATION: "a"}),
        spec=v1alpha2.NodeUpgradeJobSpec(version="v1.2.0", node_names=("gone", "down", "there", "runs")),
        status=v1alpha2.NodeUpgradeJobStatus(phase=JobPhase.FAILURE, node_status=entries),
    )
    nodes = {"down": node("down", ready=False), "there": node("there", version="v1.2.0"), "runs": node("runs")}

    outcome = retried(NODE_UPGRADE_JOB, job, nodes, now=NOW)

    assert outcome is not None
    assert [(e.node_name, e.phase, e.reason, e.attempt) for e in outcome.status.node_status] == [
        ("gone", NodeTaskPhase.FAILURE, decide.not_found("gone"), 2),
        ("down", NodeTaskPhase.FAILURE, decide.NOT_READY, 2),
        ("there", NodeTaskPhase.SUCCESSFUL, decide.already_at("v1.2.0"), 2),
        ("runs", NodeTaskPhase.PENDING, "", 2),
    ]
    assert (outcome.pending, outcome.settled) == (("runs",), ("gone", "down", "there"))
    assert outcome.notice().message == "attempt 2: 1 node run again (runs); 3 judged at once (gone, down, there)"


def test_a_value_that_cannot_retry_is_handled_with_its_reason_and_nothing_else() -> None:
    """A new value on a running job (the webhook bypassed) is recorded as handled and refused: no node moves."""
    job = prepull((entry("a", NodeTaskPhase.IN_PROGRESS),), phase=JobPhase.IN_PROGRESS)
    outcome = retried(IMAGE_PRE_PULL_JOB, job, {"a": node("a")}, now=NOW)
    assert outcome is not None
    assert outcome.status == msgspec.structs.replace(
        job.status, retry=v1alpha2.RetryStatus(handled="1", pending_event=_owed(job, outcome.notice(), "1"))
    )
    assert outcome.notice().type == "Warning"
    assert "the job is InProgress" in outcome.notice().message


def _owed(job: v1alpha2.ImagePrePullJob, notice: decide.Notice, value: str) -> v1alpha2.PendingEvent:
    meta = job.metadata
    name = event_name(meta.name, meta.uid, meta.resource_version, value)
    return v1alpha2.PendingEvent(name=name, type=notice.type, reason=notice.reason, message=notice.message)


def test_a_retry_owes_its_event_in_the_status_it_writes() -> None:
    """The decision's status carries the Event telling it, under a name the job, value and version fix."""
    job = prepull((entry("a", NodeTaskPhase.FAILURE),))
    job = msgspec.structs.replace(job, metadata=msgspec.structs.replace(job.metadata, resource_version="41"))
    outcome = retried(IMAGE_PRE_PULL_JOB, job, {"a": node("a")}, now=NOW)
    assert outcome is not None
    assert outcome.status.retry is not None
    owed = outcome.status.retry.pending_event
    assert owed == _owed(job, outcome.notice(), "1")
    assert (owed.type, owed.reason, owed.message) == ("Normal", "JobRetried", "attempt 2: 1 node run again (a)")
    again = retried(IMAGE_PRE_PULL_JOB, job, {"a": node("a")}, now=NOW + timedelta(seconds=5))
    assert again is not None
    assert again.status.retry is not None
    assert again.status.retry.pending_event == owed  # whichever controller decides, the same Event
    later = msgspec.structs.replace(job, metadata=msgspec.structs.replace(job.metadata, resource_version="57"))
    other = retried(IMAGE_PRE_PULL_JOB, later, {"a": node("a")}, now=NOW)
    assert other is not None
    assert other.status.retry is not None
    assert other.status.retry.pending_event is not None
    assert other.status.retry.pending_event.name != owed.name  # the value handled again later: a new Event


def test_an_owed_event_is_cleared_only_while_it_is_the_one_owed() -> None:
    """Clearing takes off the Event recorded, never one a later decision owes, and writes nothing when none is owed."""
    job = prepull((entry("a", NodeTaskPhase.FAILURE),))
    outcome = retried(IMAGE_PRE_PULL_JOB, job, {"a": node("a")}, now=NOW)
    assert outcome is not None
    owing = msgspec.structs.replace(job, status=outcome.status)
    owed = pending_event(owing)
    assert owed is not None
    cleared = announced(owing, owed)
    assert cleared is not None
    assert pending_event(cleared) is None
    assert outcome.status.retry is not None
    assert cleared.status.retry == msgspec.structs.replace(outcome.status.retry, pending_event=None)
    assert announced(cleared, owed) is None
    assert announced(owing, msgspec.structs.replace(owed, name="pp.another")) is None
    assert announced(job, owed) is None


def test_a_value_already_handled_asks_for_nothing() -> None:
    """The value recorded in status.retry.handled, or no annotation at all, gives no retry."""
    failed = (entry("a", NodeTaskPhase.FAILURE),)
    assert retried(IMAGE_PRE_PULL_JOB, prepull(failed, handled=v1alpha2.RetryStatus(handled="1")), {}, now=NOW) is None
    assert retried(IMAGE_PRE_PULL_JOB, prepull(failed, retry_value=None), {}, now=NOW) is None


def test_a_value_present_at_creation_is_handled_by_the_initial_status() -> None:
    """A job created with the annotation (a copied manifest) records it as handled, so it triggers nothing."""
    job = prepull((), phase=JobPhase.NONE, retry_value="copied")
    status = decide.initial_status(IMAGE_PRE_PULL_JOB, job, {"x": node("x")})
    assert status.retry == v1alpha2.RetryStatus(handled="copied")
    assert retried(IMAGE_PRE_PULL_JOB, msgspec.structs.replace(job, status=status), {}, now=NOW) is None


def test_a_retried_node_no_hub_holds_times_out_from_its_retry_not_from_the_jobs_creation() -> None:
    """Pending after a retry, an unconnected node has timeoutSeconds from the retry."""
    job = prepull((entry("a", NodeTaskPhase.FAILURE),))
    outcome = retried(IMAGE_PRE_PULL_JOB, job, {"a": node("a")}, now=NOW)
    assert outcome is not None
    again = msgspec.structs.replace(job, status=outcome.status)
    due = decide.deadline(again, again.status.node_status[0], connected=lambda _: False)
    assert due == NOW + timedelta(seconds=300)


phases = st.sampled_from([p for p in NodeTaskPhase if p.terminal])


@given(
    st.lists(phases, min_size=1, max_size=8),
    st.integers(1, 5),
    st.sampled_from([None, "0", "0.5", "1"]),
)
def test_a_retry_moves_exactly_the_failed_nodes_and_counts_them(
    node_phases: list[NodeTaskPhase], run: int, tolerate: str | None
) -> None:
    """Whatever the mix: only Failure/Unknown entries change, each to Pending at the next run, and the counts follow."""
    entries = tuple(entry(f"n{i}", p, attempt=run if i % 2 else 1) for i, p in enumerate(node_phases))
    job_phase = JobPhase.FAILURE if any(p in RETRIABLE_NODE_PHASES for p in node_phases) else JobPhase.COMPLETED
    handled = v1alpha2.RetryStatus(handled="old", attempt=run) if run > 1 else None
    job = prepull(entries, phase=job_phase, handled=handled, tolerate=tolerate)
    nodes = {e.node_name: node(e.node_name) for e in entries}

    outcome = retried(IMAGE_PRE_PULL_JOB, job, nodes, now=NOW)

    assert outcome is not None
    retriable = [e for e in entries if e.phase in RETRIABLE_NODE_PHASES]
    if not retriable:
        assert outcome.refusal
        assert outcome.status.node_status == entries
        return
    assert outcome.attempt == run + 1
    after_entries: tuple[Any, ...] = outcome.status.node_status
    for before, after in zip(entries, after_entries, strict=True):
        if before.phase in RETRIABLE_NODE_PHASES:
            assert (after.phase, after.attempt) == (NodeTaskPhase.PENDING, run + 1)
            assert after.previous_attempt is not None
            assert (after.previous_attempt.attempt, after.previous_attempt.phase) == (before.attempt, before.phase)
        else:
            assert after is before
    assert outcome.status.phase is JobPhase.IN_PROGRESS
    assert outcome.status.node_counts is not None
    assert outcome.status.node_counts.pending == len(retriable) == outcome.status.retry.nodes  # type: ignore[union-attr]
    # Handled once: the same job with its new status asks for no second retry.
    assert retried(IMAGE_PRE_PULL_JOB, msgspec.structs.replace(job, status=outcome.status), nodes, now=NOW) is None
