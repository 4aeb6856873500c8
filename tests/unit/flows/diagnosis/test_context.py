"""A Diagnosis's context keeps Tasks' results only up to its budget, and the run passes on every result all the same."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.diagnosis.context import CONTEXT_CLIPPED, MAX_CONTEXT_BYTES
from flows.diagnosis.run import advance
from flows.diagnosis.tasks import is_final
from schemas.diagnosis.graph import enumerate_paths
from schemas.diagnosis.v1 import DiagnosisPhase, TaskPhase
from tests.unit.flows.diagnosis.world import Outcome, Run, diagnosis, operation_set, operations

ETCD_LIMIT = 1536 * 1024
"""etcd's default request limit (--max-request-bytes): a Diagnosis bigger than this cannot be written."""
FORK = [[1], [2, 3], [], []]
TWO_STAGES = [[1], [2], []]


@st.composite
def clipped_runs(draw: st.DrawFn) -> Run:
    """The fork graph on up to four nodes, each Task succeeding (or failing) with results of any size, and a
    context budget from nothing to a few Tasks' worth."""
    nodes = tuple(f"n{i}" for i in range(draw(st.integers(min_value=1, max_value=4))))
    pairs = [(g, n) for g in range(1, len(FORK)) for n in nodes]
    outcome = {pair: draw(st.sampled_from((Outcome.OK, Outcome.OK, Outcome.FAIL))) for pair in pairs}
    sizes = {pair: draw(st.integers(min_value=0, max_value=400)) for pair in pairs}
    return Run(
        successors=FORK,
        outcome=lambda g, n: outcome[(g, n)],
        diagnosis=diagnosis(nodes),
        opset=operation_set(FORK),
        ops=operations(len(FORK)),
        results=lambda g, n: {"out": f"{g}@{n}:" + "x" * sizes[(g, n)]},
        context_limit=draw(st.integers(min_value=2, max_value=2000)),  # an empty context is "{}"
    )


@settings(max_examples=300, deadline=None)
@given(clipped_runs())
def test_the_context_stays_within_its_budget_and_says_when_it_left_results_out(run: Run) -> None:
    """The context's operations never pass the budget (as JSON), each kept entry is its Task's results
    exactly, and the ContextClipped condition is there exactly when a succeeded Task's results are not."""
    assert run.context_limit is not None
    run.begin()
    run.to_end()
    status = run.diagnosis.status
    assert status.context is not None
    assert len(msgspec.json.encode(status.context.operations)) <= run.context_limit
    kept = {task: results for tasks in status.context.operations.values() for task, results in tasks.items()}
    for name, results in kept.items():
        assert run.tasks[name].status.results == results
    left_out = [t for t in run.tasks.values() if t.status.phase is TaskPhase.SUCCEEDED and t.metadata.name not in kept]
    clipped = [c for c in status.conditions if c.type == CONTEXT_CLIPPED]
    if left_out:
        (condition,) = clipped
        assert any(t.metadata.name in condition.message for t in left_out)
    else:
        assert not clipped
    again = advance(run.diagnosis, run.world())
    assert again.status == status


@settings(max_examples=200, deadline=None)
@given(clipped_runs())
def test_a_full_context_still_passes_every_result_to_the_next_stages(run: Run) -> None:
    """Each Task's request data holds its node's earlier results on its path, whole, whatever the context kept."""
    run.begin()
    run.to_end()
    paths = enumerate_paths(run.successors)
    assert run.results is not None
    for task in run.created:
        _, _, node, j, k, _ = task.metadata.name.split(".")
        before = paths[int(j)][1 : int(k) + 1]
        expected = {f"op-{g}.out": run.results(g, node)["out"] for g in before if run.outcome(g, node) is Outcome.OK}
        passed = {key: value for key, value in task.spec.parameters.items() if key.startswith("op-")}
        assert passed == expected


def test_a_thousand_node_diagnosis_of_large_results_stays_under_etcds_limit() -> None:
    """1,000 nodes, two stages, each Task reporting 4 KiB: the Diagnosis (8 MiB of results in KubeDiag's
    context) stays under 1.5 MiB with the default budget, and the second stage still gets the first's output."""
    nodes = tuple(f"edge-node-{i:05d}" for i in range(1000))
    run = Run(
        successors=TWO_STAGES,
        outcome=lambda g, n: Outcome.OK,
        diagnosis=diagnosis(nodes),
        opset=operation_set(TWO_STAGES),
        ops=operations(len(TWO_STAGES)),
        results=lambda g, n: {"out": f"{g}@{n}:" + "x" * 4096},
    )
    run.begin()
    run.to_end()
    status = run.diagnosis.status
    assert status.phase is DiagnosisPhase.SUCCEEDED
    assert all(is_final(t.status.phase) for t in run.tasks.values())
    assert len(msgspec.json.encode(run.diagnosis)) < ETCD_LIMIT
    assert status.context is not None
    assert MAX_CONTEXT_BYTES // 2 < len(msgspec.json.encode(status.context.operations)) <= MAX_CONTEXT_BYTES
    assert [c.type for c in status.conditions].count(CONTEXT_CLIPPED) == 1
    second = [t for t in run.created if t.spec.operation == "op-2"]
    assert len(second) == len(nodes)
    for task in second:
        assert task.spec.parameters["op-1.out"] == f"1@{task.spec.node_name}:" + "x" * 4096
