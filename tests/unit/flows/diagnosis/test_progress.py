"""Progress within a stage may be held back: a status that only counts more ended Tasks is written with the next."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from flows.diagnosis.run import advance, progress_only
from schemas.diagnosis.v1 import DiagnosisPhase
from tests.unit.flows.diagnosis.test_run import runs
from tests.unit.flows.diagnosis.world import Outcome, Run, diagnosis, operation_set, operations

pytestmark = pytest.mark.slow(45)

CHAIN = [[1], [2], []]


@settings(max_examples=200, deadline=None)
@given(runs())
def test_never_writing_progress_within_a_stage_ends_every_run_the_same(run: Run) -> None:
    """A controller that holds back every status only counting ended Tasks of a stage (and still creates the
    stage's Tasks) ends the run as one writing every step: same phase, paths, context and Tasks, none twice."""
    twin = Run(run.successors, run.outcome, run.diagnosis, run.opset, run.ops)
    run.hold_progress = True
    run.begin()
    run.to_end()
    twin.begin()
    twin.to_end()
    held, written = run.diagnosis.status, twin.diagnosis.status
    assert held.phase is written.phase
    assert (held.failed_paths, held.succeeded_path) == (written.failed_paths, written.succeeded_path)
    assert held.context == written.context
    assert sorted(t.metadata.name for t in run.created) == sorted(t.metadata.name for t in twin.created)
    assert run.writes <= twin.writes


def _chain(silent: set[str]) -> Run:
    nodes = tuple(f"n{i}" for i in range(10))
    return Run(
        successors=CHAIN,
        outcome=lambda g, n: Outcome.SILENT if g == 1 and n in silent else Outcome.OK,
        diagnosis=diagnosis(nodes),
        opset=operation_set(CHAIN),
        ops=operations(len(CHAIN)),
    )


def test_counting_some_tasks_of_a_stage_is_progress_and_deciding_the_stage_is_not() -> None:
    """Ten nodes, one silent in the first stage: the step counting the nine others is progress only; the step
    that declares the silent one Unknown, failing the stage and the run, is not."""
    run = _chain({"n9"})
    run.begin()
    assert len(run.turn().create) == 10  # the first stage's Tasks; nine answer at once
    before = run.diagnosis.status
    counting = advance(run.diagnosis, run.world())
    assert counting.status.checkpoint is not None
    assert (counting.status.checkpoint.succeeded, counting.status.checkpoint.active) == (9, 1)
    assert progress_only(before, counting)
    assert counting.due is not None
    run.now = counting.due
    verdict = run.turn()
    assert verdict.status.phase is DiagnosisPhase.FAILED
    assert not progress_only(before, verdict)


def test_a_stage_that_passes_moves_on_at_once() -> None:
    """Every node answers: the step after the first stage's Tasks starts the second stage, which is no mere
    progress (its Tasks are created after that status is written)."""
    run = _chain(set())
    run.begin()
    run.turn()
    before = run.diagnosis.status
    moving = advance(run.diagnosis, run.world())
    assert moving.status.checkpoint is not None
    assert moving.status.checkpoint.node_index == 1
    assert len(moving.create) == 10
    assert not progress_only(before, moving)
