"""The hub's pure status changes: claims bound concurrency, records apply once, other jobs are refused."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.nodejobs import imageprepulljob
from flows.nodejobs.changes import ClaimOutcome, claim, record
from nodetask.messages import ActionResult
from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase
from schemas.access import counted
from schemas.meta import ObjectMeta
from schemas.v1alpha2 import (
    ImagePrePullJob,
    ImagePrePullJobSpec,
    ImagePrePullJobStatus,
    ImagePrePullNodeTaskStatus,
    ImagePrePullTemplate,
    ImageStatus,
)

JT = imageprepulljob.JOB_TYPE
NOW = "2026-11-26T00:00:00Z"


def _job(phases: list[NodeTaskPhase], *, concurrency: int, uid: str = "u1") -> ImagePrePullJob:
    return ImagePrePullJob(
        metadata=ObjectMeta(name="j", uid=uid),
        spec=ImagePrePullJobSpec(
            image_pre_pull_template=ImagePrePullTemplate(images=("a/b:1",), concurrency=concurrency)
        ),
        status=ImagePrePullJobStatus(
            phase=JobPhase.IN_PROGRESS,
            node_status=tuple(ImagePrePullNodeTaskStatus(node_name=f"n{i}", phase=p) for i, p in enumerate(phases)),
        ),
    )


def _running(job: Any) -> int:
    return sum(e.phase is NodeTaskPhase.IN_PROGRESS for e in job.status.node_status)


@settings(max_examples=200)
@given(
    nodes=st.integers(min_value=1, max_value=12),
    concurrency=st.integers(min_value=1, max_value=5),
    order=st.lists(st.integers(min_value=0, max_value=11), max_size=40),
)
def test_claims_in_any_order_never_exceed_concurrency(nodes: int, concurrency: int, order: list[int]) -> None:
    """However many hubs claim whichever nodes, at most `concurrency` nodes end up InProgress."""
    job: Any = _job([NodeTaskPhase.PENDING] * nodes, concurrency=concurrency)
    claimed = 0
    for i in order:
        new, outcome = claim(f"n{i % nodes}", uid="u1", now=NOW)(job)
        if outcome is ClaimOutcome.CLAIMED:
            claimed += 1
            job = new
        else:
            assert new is None
        assert _running(job) <= concurrency
    assert claimed == min(concurrency, len({i % nodes for i in order}))


def test_claim_sets_dispatch_time_and_refuses_taken_or_foreign_jobs() -> None:
    """A claim stamps dispatchTime; a node no longer Pending or a re-created job is not claimed."""
    job = _job([NodeTaskPhase.PENDING, NodeTaskPhase.SUCCESSFUL], concurrency=2)
    new, outcome = claim("n0", uid="u1", now=NOW)(job)
    assert outcome is ClaimOutcome.CLAIMED
    assert new is not None
    assert new.status.node_status[0].dispatch_time == NOW
    assert claim("n1", uid="u1", now=NOW)(job) == (None, ClaimOutcome.TAKEN)
    assert claim("n0", uid="other", now=NOW)(job) == (None, ClaimOutcome.GONE)
    assert claim("missing", uid="u1", now=NOW)(job) == (None, ClaimOutcome.GONE)


def test_record_applies_once_and_rejects_what_can_never_apply() -> None:
    """A result is recorded once; its duplicate changes nothing; an unknown action or old job is an error."""
    job = _job([NodeTaskPhase.IN_PROGRESS], concurrency=1)
    check = ActionResult(action="Check", succ=True, finish_time=NOW)
    new, outcome = record(JT, "n0", check, uid="u1", now=NOW)(job)
    assert outcome.applied
    assert new is not None
    assert [a.action for a in new.status.node_status[0].action_flow] == ["Check"]
    again, dup = record(JT, "n0", check, uid="u1", now=NOW)(new)
    assert again is None
    assert (dup.applied, dup.acknowledge) == (False, True)
    _, unknown = record(JT, "n0", ActionResult(action="Teleport", succ=True), uid="u1", now=NOW)(job)
    assert not unknown.acknowledge
    assert "Teleport" in unknown.error
    _, old = record(JT, "n0", check, uid="u0", now=NOW)(job)
    assert "re-created" in old.error


def _report(action: str, succ: bool, images: tuple[tuple[str, bool], ...] = ()) -> ActionResult:
    extend = ""
    if action == imageprepulljob.PULL:
        extend = imageprepulljob.encode_extend(
            tuple(
                ImageStatus(image=i, status=ConditionStatus.TRUE if ok else ConditionStatus.FALSE) for i, ok in images
            )
        )
    return ActionResult(action=action, succ=succ, finish_time=NOW, reason="" if succ else "no", extend=extend)


reports = st.lists(
    st.builds(
        _report,
        st.sampled_from([imageprepulljob.CHECK, imageprepulljob.PULL]),
        st.booleans(),
        st.lists(st.tuples(st.sampled_from(["a/b:1", "c/d:2"]), st.booleans()), max_size=2).map(tuple),
    ),
    max_size=8,
)


@settings(max_examples=300)
@given(sequence=reports, redelivered=st.lists(st.integers(min_value=0, max_value=7), max_size=6))
def test_compact_entries_decide_what_full_entries_decide_and_redeliveries_change_nothing(
    sequence: list[ActionResult], redelivered: list[int]
) -> None:
    """A large job's entries reach the same phases as full ones; a redelivered report changes nothing."""
    full: Any = _job([NodeTaskPhase.IN_PROGRESS], concurrency=1)
    slim: Any = full
    for result in sequence:
        full = record(JT, "n0", result, uid="u1", now=NOW)(full)[0] or full
        slim = record(JT, "n0", result, uid="u1", now=NOW, compact_above=0)(slim)[0] or slim
    f, s = full.status.node_status[0], slim.status.node_status[0]
    assert (s.phase, s.reason) == (f.phase, f.reason)
    if f.phase is NodeTaskPhase.SUCCESSFUL:
        assert s.action_flow == f.action_flow[-1:]
        assert s.image_status == () or any(i.status is not ConditionStatus.TRUE for i in s.image_status)
    else:
        assert s == f
    for i in redelivered:
        if i < len(sequence):
            again, outcome = record(JT, "n0", sequence[i], uid="u1", now=NOW, compact_above=0)(slim)
            assert again is None
            assert outcome.acknowledge


def test_only_jobs_above_the_threshold_keep_compact_entries() -> None:
    """A node that pulled every image keeps only its last action in a large job, and everything in a small one."""
    check = _report(imageprepulljob.CHECK, True)
    pull = _report(imageprepulljob.PULL, True, (("a/b:1", True),))
    for compact_above, flow, images in ((1, ["Check", "Pull"], 1), (0, ["Pull"], 0)):
        job: Any = _job([NodeTaskPhase.IN_PROGRESS], concurrency=1)
        for result in (check, pull):
            job = record(JT, "n0", result, uid="u1", now=NOW, compact_above=compact_above)(job)[0]
        entry = job.status.node_status[0]
        assert entry.phase is NodeTaskPhase.SUCCESSFUL
        assert [a.action for a in entry.action_flow] == flow
        assert len(entry.image_status) == images


@given(st.permutations([f"n{i}" for i in range(6)]), st.lists(st.integers(min_value=0, max_value=6), max_size=20))
def test_nodes_are_found_whatever_layout_a_job_copy_has(names: list[str], lookups: list[int]) -> None:
    """Jobs sharing a UID and a size but laid out differently never answer for each other's entries."""
    first: Any = _job([NodeTaskPhase.PENDING] * 6, concurrency=1, uid="layout")
    entries = tuple(ImagePrePullNodeTaskStatus(node_name=n, phase=NodeTaskPhase.PENDING) for n in names)
    second: Any = msgspec.structs.replace(first, status=msgspec.structs.replace(first.status, node_status=entries))
    for i in lookups:
        for job in (first, second):
            node = f"n{i}"
            new, outcome = claim(node, uid="layout", now=NOW)(job)
            if i == 6:
                assert outcome is ClaimOutcome.GONE
                continue
            assert outcome is ClaimOutcome.CLAIMED
            assert new is not None
            claimed = [e.node_name for e in new.status.node_status if e.phase is NodeTaskPhase.IN_PROGRESS]
            assert claimed == [node]


@given(order=st.lists(st.integers(min_value=0, max_value=4), max_size=10))
def test_counted_jobs_carry_the_counts_the_controller_would_write(order: list[int]) -> None:
    """After any claims, the counts the hub writes are the controller's; a second count changes nothing."""
    job: Any = _job([NodeTaskPhase.PENDING] * 5, concurrency=3)
    for i in order:
        job = claim(f"n{i}", uid="u1", now=NOW)(job)[0] or job
    job = counted(job)
    running = sum(e.phase is NodeTaskPhase.IN_PROGRESS for e in job.status.node_status)
    assert job.status.node_counts.total == 5
    assert job.status.node_counts.in_progress == running
    assert job.status.node_counts.pending == 5 - running
    assert counted(job) is job
