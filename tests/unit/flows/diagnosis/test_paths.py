"""An OperationSet's paths compile into one action flow that tries them in order, shared prefixes once."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.diagnosis.paths import PathFlow, action_name, compile_paths
from nodetask.flow import UnknownActionError
from schemas.diagnosis.graph import status_paths
from schemas.diagnosis.v1 import AdjacencyNode, Path
from tests.unit.schemas.diagnosis.strategies import dags

KUBEDIAG_GRAPH = [[1, 2, 3], [4, 5], [5], [6], [7, 8], [3, 6, 7], [8], [], []]

Prefix = tuple[int, ...]


def nodes_of(successors: list[list[int]]) -> list[AdjacencyNode]:
    return [AdjacencyNode(to=tuple(to), operation=f"op-{i}" if i else "") for i, to in enumerate(successors)]


def compiled(successors: list[list[int]]) -> PathFlow:
    return compile_paths(status_paths(nodes_of(successors)))


def path(*ids: int) -> Path:
    return tuple(AdjacencyNode(id=i, operation=f"op-{i}") for i in ids)


def walk(plan: PathFlow, outcome: Mapping[Prefix, bool]) -> tuple[list[str], bool]:
    """The actions a diagnosis runs, in order, and whether it succeeded, given each stage's verdict."""
    visited: list[str] = []
    action: str | None = plan.flow.first
    while action is not None:
        visited.append(action)
        ok = outcome[plan.prefix(action)]
        action = plan.flow.next(action, ok)
    return visited, ok


def rerunning_walk(paths: tuple[Prefix, ...], outcome: Mapping[Prefix, bool]) -> tuple[list[Prefix], int | None]:
    """KubeDiag's walk: each path from its first stage, shared stages run again; the path that succeeded."""
    executed: list[Prefix] = []
    for j, stages in enumerate(paths):
        for depth in range(len(stages)):
            executed.append(stages[: depth + 1])
            if not outcome[stages[: depth + 1]]:
                break
        else:
            return executed, j
    return executed, None


def test_kubediag_graph_compiles_to_one_action_per_prefix() -> None:
    """Nine paths, 22 distinct prefixes, 22 actions, each named by the first path through it and its stage."""
    plan = compiled(KUBEDIAG_GRAPH)
    prefixes = {p[: k + 1] for p in plan.paths for k in range(len(p))}
    assert len(plan.paths) == 9
    assert len(plan.flow.actions) == len(prefixes) == 22
    assert {plan.prefix(a) for a in plan.flow.actions} == prefixes
    assert plan.flow.first == "p0s0"
    assert plan.prefix("p0s0") == (1,)
    assert plan.prefix("p2s1") == (1, 5)


# Paths, depth-first: 0:1-4-7 1:1-4-8 2:1-5-3-6-8 3:1-5-6-8 4:1-5-7 5:2-5-3-6-8 6:2-5-6-8 7:2-5-7 8:3-6-8
@pytest.mark.parametrize(
    ("action", "on_success", "on_failure"),
    [
        ("p0s0", "p0s1", "p5s0"),  # node 1 failed: every path through it failed; the next starts at node 2
        ("p0s1", "p0s2", "p2s1"),  # node 1 passed already: path 2 goes on at node 5, not at node 1
        ("p0s2", None, "p1s2"),  # a whole path passed: the run succeeded
        ("p2s4", None, "p3s2"),
        ("p4s2", None, "p5s0"),
        ("p5s1", "p5s2", "p8s0"),  # the same graph node 5 after node 2 is another stage
        ("p8s2", None, None),  # the last path failed: the run failed
    ],
)
def test_edges_go_to_the_next_stage_or_the_next_path_past_the_shared_prefix(
    action: str, on_success: str | None, on_failure: str | None
) -> None:
    """Success continues the path; failure goes to the first stage the next path does not share."""
    plan = compiled(KUBEDIAG_GRAPH)
    assert (plan.flow.next(action, True), plan.flow.next(action, False)) == (on_success, on_failure)


def test_stages_know_their_node_operation_and_paths() -> None:
    """A stage maps to its graph node and operation, and to the paths it runs for (a checkpoint's position)."""
    plan = compiled(KUBEDIAG_GRAPH)
    stage = plan.stage("p2s1")
    assert (stage.node, stage.operation, stage.depth) == (5, "op-5", 1)
    assert (stage.first_path, stage.last_path) == (2, 4)
    assert plan.action_at(4, 1) == plan.action_at(2, 1) == "p2s1"  # path 4 shares 1-5 with path 2
    assert plan.action_at(4, 0) == "p0s0"
    assert plan.action_at(8, 2) == "p8s2"
    with pytest.raises(UnknownActionError, match="no stage 3 on path 8"):
        plan.action_at(8, 3)
    with pytest.raises(UnknownActionError, match="invalid diagnosis action 'p1s0'"):
        plan.stage("p1s0")


def test_a_failure_deep_in_a_path_reuses_its_passed_prefix() -> None:
    """1 and 1-4 pass, 1-4-7 and 1-4-8 fail, then 1-5 runs without running 1 again."""
    plan = compiled(KUBEDIAG_GRAPH)
    outcome = {p[: k + 1]: True for p in plan.paths for k in range(len(p))}
    outcome |= {(1, 4, 7): False, (1, 4, 8): False, (1, 5, 3): False}
    visited, ok = walk(plan, outcome)
    assert ok
    assert [plan.prefix(a) for a in visited] == [
        (1,),
        (1, 4),
        (1, 4, 7),
        (1, 4, 8),
        (1, 5),
        (1, 5, 3),
        (1, 5, 6),
        (1, 5, 6, 8),
    ]


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ([], "no path to compile"),
        ([()], "path 0 has no stage"),
        ([(AdjacencyNode(operation="a"),)], "path 0 has a node without an id"),
        ([path(1, 2), path(3), path(1, 4)], "paths 0 and 2 begin with stage 0 of path 0 but path 1 does not"),
        ([path(1, 2), path(1, 2, 3)], "path 0 is the beginning of path 1"),
        ([path(1, 2, 3), path(1, 2)], "path 1 is the beginning of path 0"),
        ([path(1, 2), path(1, 2)], "paths 0 and 1 are the same"),
        ([path(1), (AdjacencyNode(id=1, operation="other"),)], "node 1 has two operations"),
    ],
)
def test_paths_that_cannot_be_one_flow_are_refused(paths: list[Path], message: str) -> None:
    """Empty, unnumbered, interleaved, nested or repeated paths are errors saying which."""
    with pytest.raises(ValueError, match=message):
        compile_paths(paths)


@st.composite
def plans_and_outcomes(draw: st.DrawFn) -> tuple[PathFlow, dict[Prefix, bool]]:
    successors = draw(dags().filter(lambda s: len(s) > 1 and bool(s[0])))
    plan = compiled(successors)
    prefixes = sorted({p[: k + 1] for p in plan.paths for k in range(len(p))})
    outcome = draw(st.fixed_dictionaries({p: st.booleans() for p in prefixes}))
    return plan, outcome


@given(plans_and_outcomes())
def test_walks_run_each_prefix_once_and_end_at_the_first_path_that_passes(
    case: tuple[PathFlow, dict[Prefix, bool]],
) -> None:
    """Any verdicts: each prefix runs at most once, and the run ends as KubeDiag's re-running walk would."""
    plan, outcome = case
    actions, ok = walk(plan, outcome)
    visited = [plan.prefix(a) for a in actions]
    executed, succeeded = rerunning_walk(plan.paths, outcome)
    assert len(set(visited)) == len(visited) == len(set(actions))
    assert visited == list(dict.fromkeys(executed))  # the same stages in the same order, repeats left out
    assert ok == (succeeded is not None)
    if succeeded is not None:
        assert visited[-1] == plan.paths[succeeded]
        assert all(outcome[plan.paths[succeeded][: k + 1]] for k in range(len(plan.paths[succeeded])))
    earlier = plan.paths if succeeded is None else plan.paths[:succeeded]
    assert all(not all(outcome[p[: k + 1]] for k in range(len(p))) for p in earlier)


@given(plans_and_outcomes())
def test_each_stage_runs_for_the_path_the_rerunning_walk_was_on(case: tuple[PathFlow, dict[Prefix, bool]]) -> None:
    """Each action is named by the path KubeDiag's walk was on when it first ran that prefix, and its stage."""
    plan, outcome = case
    actions, _ = walk(plan, outcome)
    first_run: dict[Prefix, int] = {}
    for j, stages in enumerate(plan.paths):
        for depth in range(len(stages)):
            first_run.setdefault(stages[: depth + 1], j)
            if not outcome[stages[: depth + 1]]:
                break
        else:
            break
    for action in actions:
        prefix = plan.prefix(action)
        assert action == action_name(first_run[prefix], len(prefix) - 1)
        assert plan.stage(action).first_path == first_run[prefix]
