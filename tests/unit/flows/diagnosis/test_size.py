"""A Diagnosis's status stays within what etcd stores: the context gives way, and what cannot fit fails the run."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.diagnosis.pipeline import Pipeline, pipeline_of
from flows.diagnosis.run import advance, start
from flows.diagnosis.size import MAX_OBJECT_BYTES, STATUS_TOO_LARGE, object_bytes
from flows.diagnosis.stages import PODS_ANNOTATION
from flows.diagnosis.step import FINAL_PHASES
from flows.diagnosis.targets import Resolution
from schemas.diagnosis.v1 import Diagnosis, DiagnosisPhase, PodReference
from tests.unit.flows.diagnosis.test_run import runs
from tests.unit.flows.diagnosis.world import Outcome, Run, diagnosis, operation_set, operations

TWO_STAGES = [[1], [2], []]


def _complete(d: Diagnosis) -> tuple[str, str]:
    [complete] = [c for c in d.status.conditions if c.type == "Complete"]
    return complete.reason, complete.message


def test_a_run_on_more_targets_than_its_status_can_hold_fails_at_start_saying_so() -> None:
    """8,000 target nodes of 100 characters, named in the spec: their copy in status.nodeNames would take the
    Diagnosis past etcd's limit, so the run fails at once with StatusTooLarge, naming the nodes' share, in a
    status that can be written (KubeDiag's status write is refused, and retried, forever)."""
    nodes = tuple(f"edge-{i:05d}-" + "n" * 89 for i in range(8000))
    run = Run(
        successors=TWO_STAGES,
        outcome=lambda g, n: Outcome.OK,
        diagnosis=diagnosis(nodes),
        opset=operation_set(TWO_STAGES),
        ops=operations(len(TWO_STAGES)),
    )
    step = start(run.diagnosis, run.world(), Resolution(nodes))
    ended = msgspec.structs.replace(run.diagnosis, status=step.status)
    assert step.status.phase is DiagnosisPhase.FAILED
    reason, message = _complete(ended)
    assert reason == STATUS_TOO_LARGE
    assert "the names of its 8000 target nodes" in message
    [accepted] = [c for c in step.status.conditions if c.type == "Accepted"]
    assert (accepted.status, accepted.reason) == ("False", STATUS_TOO_LARGE)
    assert step.status.node_names == ()
    assert not step.labels
    assert object_bytes(ended) < MAX_OBJECT_BYTES
    assert [n.reason for n in step.notices] == ["DiagnosisFailed"]


def test_pods_too_many_for_the_annotations_fail_the_run_at_start() -> None:
    """3,000 target pods with long names: the pod each node's Tasks carry would not fit in the annotations
    Kubernetes allows (256 KiB), so the run fails at once instead of having its metadata refused forever."""
    nodes = tuple(f"edge-{i:05d}" for i in range(3000))
    pods = {n: PodReference(namespace="default", name=f"web-{n}-" + "p" * 80) for n in nodes}
    run = Run(
        successors=TWO_STAGES,
        outcome=lambda g, n: Outcome.OK,
        diagnosis=diagnosis(nodes),
        opset=operation_set(TWO_STAGES),
        ops=operations(len(TWO_STAGES)),
    )
    step = start(run.diagnosis, run.world(), Resolution(nodes, pods))
    assert step.status.phase is DiagnosisPhase.FAILED
    reason, message = _complete(msgspec.structs.replace(run.diagnosis, status=step.status))
    assert reason == STATUS_TOO_LARGE
    assert f"in the annotation {PODS_ANNOTATION}" in message
    assert PODS_ANNOTATION not in step.annotations


def test_a_status_that_would_not_fit_mid_run_ends_the_run_failed_and_small() -> None:
    """A run whose next status would pass the limit (here, the limit lowered under it) ends Failed with
    StatusTooLarge instead, its status without node names and results, and creates no Task."""
    nodes = tuple(f"n{i}" for i in range(20))
    run = Run(
        successors=TWO_STAGES,
        outcome=lambda g, n: Outcome.OK,
        diagnosis=diagnosis(nodes),
        opset=operation_set(TWO_STAGES),
        ops=operations(len(TWO_STAGES)),
    )
    run.begin()
    run.turn()  # the first stage's Tasks, which succeed at once
    run.object_limit = object_bytes(run.diagnosis) + 100
    step = advance(run.diagnosis, run.world())
    ended = msgspec.structs.replace(run.diagnosis, status=step.status)
    assert step.status.phase is DiagnosisPhase.FAILED
    reason, message = _complete(ended)
    assert reason == STATUS_TOO_LARGE
    assert f"more than the {run.object_limit} a Diagnosis may" in message
    assert step.status.node_names == ()
    assert step.status.context is not None
    assert step.status.context.operations == {}
    assert step.create == ()
    assert advance(ended, run.world()).status == step.status


@settings(max_examples=200, deadline=None)
@given(runs(), st.integers(min_value=-2000, max_value=6000), st.integers(min_value=0, max_value=300))
def test_every_status_written_fits_and_a_run_that_started_never_ends_too_large(
    run: Run, headroom: int, result_size: int
) -> None:
    """Whatever the limit (from less than the started Diagnosis takes to a few kilobytes more) and the results,
    no status written takes the Diagnosis past it; a run that could not fit fails at its start, and a run that
    started ends as it would have, its context clipped to what is left."""
    probe = Run(run.successors, run.outcome, run.diagnosis, run.opset, run.ops)
    probe.begin()
    pipeline = pipeline_of(run.opset)
    assert isinstance(pipeline, Pipeline)
    run.object_limit = object_bytes(probe.diagnosis) + pipeline.paths_bytes + 16 * 1024 + headroom
    run.results = lambda g, n: {"out": "x" * result_size}
    twin = Run(run.successors, run.outcome, run.diagnosis, run.opset, run.ops, results=run.results)
    run.begin()
    if run.diagnosis.status.phase is DiagnosisPhase.FAILED:
        assert _complete(run.diagnosis)[0] == STATUS_TOO_LARGE
        assert object_bytes(run.diagnosis) <= run.object_limit
        return
    for _ in range(10_000):
        if run.diagnosis.status.phase in FINAL_PHASES:
            break
        before = (run.diagnosis.status, len(run.tasks))
        step = run.turn()
        assert object_bytes(run.diagnosis) <= run.object_limit
        if (run.diagnosis.status, len(run.tasks)) == before and not step.expire:
            assert step.due is not None
            run.now = step.due
    twin.begin()
    twin.to_end()
    status = run.diagnosis.status
    assert _complete(run.diagnosis)[0] != STATUS_TOO_LARGE
    assert status.phase is twin.diagnosis.status.phase
    assert (status.failed_paths, status.succeeded_path) == (
        twin.diagnosis.status.failed_paths,
        twin.diagnosis.status.succeeded_path,
    )
