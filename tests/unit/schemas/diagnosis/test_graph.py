"""An OperationSet's graph is checked whole, and its paths are KubeDiag's, in a fixed depth-first order."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.diagnosis.graph import (
    MAX_PATHS,
    MAX_PATHS_BYTES,
    MAX_PROBLEMS,
    MAX_STAGES,
    GraphProblem,
    count_paths,
    count_paths_bytes,
    count_stages,
    enumerate_paths,
    problems,
    status_paths,
)
from schemas.diagnosis.v1 import AdjacencyNode
from tests.unit.schemas.diagnosis.strategies import dags

# KubeDiag's pkg/graphbuilder/graphbuilder_test.go, TestSearchDiagnosisPaths ("paths found").
KUBEDIAG_GRAPH = [[1, 2, 3], [4, 5], [5], [6], [7, 8], [3, 6, 7], [8], [], []]
KUBEDIAG_PATHS = [
    (0, 1, 4, 7),
    (0, 1, 5, 7),
    (0, 2, 5, 7),
    (0, 1, 4, 8),
    (0, 3, 6, 8),
    (0, 1, 5, 3, 6, 8),
    (0, 2, 5, 3, 6, 8),
    (0, 1, 5, 6, 8),
    (0, 2, 5, 6, 8),
]


def graph(successors: list[list[int]]) -> list[AdjacencyNode]:
    return [AdjacencyNode(to=tuple(to), operation=f"op-{i}" if i else "") for i, to in enumerate(successors)]


@pytest.mark.parametrize(
    ("successors", "expected"),
    [
        pytest.param([], "start node not found in graph", id="start node not found"),
        pytest.param([[]], [], id="one node graph"),
        pytest.param(KUBEDIAG_GRAPH, KUBEDIAG_PATHS, id="paths found"),
    ],
)
def test_kubediag_graph_builder_vectors(successors: list[list[int]], expected: list[tuple[int, ...]] | str) -> None:
    """KubeDiag's own graph-builder cases give its results (compared as sets, as its test does)."""
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            enumerate_paths(successors)
        return
    paths = enumerate_paths(successors)
    assert len(paths) == len(expected)
    assert set(paths) == set(expected)
    assert count_paths(successors) == len(expected)
    assert count_stages(successors) == sum(len(p) - 1 for p in expected)


def test_paths_are_depth_first_in_to_order() -> None:
    """The order is fixed (KubeDiag's follows Go map iteration): depth-first, successors as listed."""
    assert enumerate_paths(KUBEDIAG_GRAPH) == (
        (0, 1, 4, 7),
        (0, 1, 4, 8),
        (0, 1, 5, 3, 6, 8),
        (0, 1, 5, 6, 8),
        (0, 1, 5, 7),
        (0, 2, 5, 3, 6, 8),
        (0, 2, 5, 6, 8),
        (0, 2, 5, 7),
        (0, 3, 6, 8),
    )
    assert enumerate_paths([[2, 1], [], []]) == ((0, 2), (0, 1))


def test_status_paths_are_node_copies_without_the_start() -> None:
    """status.paths holds copies of the nodes after the start, each with its id set to its position."""
    nodes = graph([[1, 2], [2], []])
    assert [[(n.id, n.operation, n.to) for n in path] for path in status_paths(nodes)] == [
        [(1, "op-1", (2,)), (2, "op-2", ())],
        [(2, "op-2", ())],
    ]


def test_valid_graphs_have_no_problem() -> None:
    """KubeDiag's nine-node graph and a plain two-node graph pass every check."""
    assert problems(graph(KUBEDIAG_GRAPH)) == ()
    assert problems([AdjacencyNode(id=0, to=(1,)), AdjacencyNode(id=1, operation="collect")]) == ()


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param([], [(None, "", "needs at least two nodes")], id="empty"),
        pytest.param([AdjacencyNode()], [(None, "", "needs at least two nodes")], id="start only"),
        pytest.param(
            [AdjacencyNode(to=(1,), operation="x"), AdjacencyNode(operation="a")],
            [(0, "operation", "the start node 0 has no operation, got 'x'")],
            id="start with an operation",
        ),
        pytest.param(
            [AdjacencyNode(to=(1,), dependences=(1,)), AdjacencyNode(operation="a")],
            [(0, "dependences", "the start node 0 has no dependences")],
            id="start with dependences",
        ),
        pytest.param(
            [AdjacencyNode(to=(1,)), AdjacencyNode()],
            [(1, "operation", "node 1 has no operation")],
            id="node without operation",
        ),
        pytest.param(
            [AdjacencyNode(to=(1,)), AdjacencyNode(id=2, operation="a")],
            [(1, "id", "node 1 has id 2: ids are list positions")],
            id="id not its position",
        ),
        pytest.param(
            [AdjacencyNode(to=(1, 5)), AdjacencyNode(operation="a")],
            [(0, "to[1]", "node 0 leads to node 5, which does not exist (ids are 0 to 1)")],
            id="edge out of range",
        ),
        pytest.param(
            [AdjacencyNode(to=(1, -1)), AdjacencyNode(operation="a")],
            [(0, "to[1]", "node 0 leads to node -1, which does not exist")],
            id="negative edge",
        ),
        pytest.param(
            [AdjacencyNode(to=(1,)), AdjacencyNode(operation="a", to=(1,))],
            [(1, "to[0]", "node 1 (a) leads to itself")],
            id="self loop (gonum panics)",
        ),
        pytest.param(
            [AdjacencyNode(to=(1,)), AdjacencyNode(operation="a", to=(0,))],
            [(1, "to[0]", "node 1 (a) leads back to the start node 0")],
            id="start indegree not 0",
        ),
        pytest.param(
            [AdjacencyNode(to=(1, 1)), AdjacencyNode(operation="a")],
            [(0, "to[1]", "node 0 lists node 1 twice")],
            id="duplicate edge",
        ),
        pytest.param(
            [AdjacencyNode(to=(1,)), AdjacencyNode(operation="a"), AdjacencyNode(operation="b")],
            [(2, "", "node 2 (b) is not reachable from the start node 0")],
            id="unreachable sink",
        ),
        pytest.param(
            [
                AdjacencyNode(to=(1,)),
                AdjacencyNode(operation="a"),
                AdjacencyNode(operation="b", to=(3,)),
                AdjacencyNode(operation="c", to=(2,)),
            ],
            [
                (2, "", "node 2 (b) is not reachable from the start node 0"),
                (3, "", "node 3 (c) is not reachable from the start node 0"),
            ],
            id="unreachable cycle (indegree above 0 everywhere)",
        ),
        pytest.param(
            [
                AdjacencyNode(to=(1,)),
                AdjacencyNode(operation="a", to=(2,)),
                AdjacencyNode(operation="b", to=(3,)),
                AdjacencyNode(operation="c", to=(1,)),
            ],
            [(1, "to", "node 1 (a) is on the cycle 1 -> 2 -> 3 -> 1")],
            id="cycle",
        ),
    ],
)
def test_each_problem_names_its_node(nodes: list[AdjacencyNode], expected: list[tuple[int | None, str, str]]) -> None:
    """Every fault is found, once, at the node and field it belongs to, with a message naming the node."""
    found = problems(nodes)
    assert [(p.node, p.field) for p in found] == [(node, field) for node, field, _ in expected]
    for problem, (_, _, message) in zip(found, expected, strict=True):
        assert message in problem.message


def test_all_problems_are_reported_at_once() -> None:
    """Several faults in one list are all reported (KubeDiag stops at the first)."""
    nodes = [AdjacencyNode(to=(1, 9), operation="x"), AdjacencyNode(), AdjacencyNode(operation="b")]
    assert {(p.node, p.field) for p in problems(nodes)} == {(0, "operation"), (0, "to[1]"), (1, "operation"), (2, "")}


def test_problem_paths_point_into_the_adjacency_list() -> None:
    """A problem's path is the field path admission reports."""
    assert GraphProblem(3, "to[1]", "m").path() == "spec.adjacencyList[3].to[1]"
    assert GraphProblem(3, "", "m").path() == "spec.adjacencyList[3]"
    assert GraphProblem(None, "", "m").path() == "spec.adjacencyList"


def test_too_many_paths_are_refused_before_any_is_built() -> None:
    """A graph of 2**k paths is counted in linear time and refused past the limit, naming the count."""
    k = 40  # layers of two nodes, each leading to both nodes of the next: 2**40 paths
    successors = [[1, 2]]
    for i in range(k):
        successors += [[2 * i + 3, 2 * i + 4], [2 * i + 3, 2 * i + 4]] if i < k - 1 else [[], []]
    nodes = [AdjacencyNode(to=tuple(s), operation=f"op-{i}" if i else "") for i, s in enumerate(successors)]
    assert count_paths(successors) == 2**k
    [problem] = problems(nodes)
    assert problem.node is None
    assert f"{2**k} paths lead from the start node" in problem.message
    assert f"at most {MAX_PATHS}" in problem.message
    with pytest.raises(ValueError, match="at most 128 are allowed"):
        enumerate_paths(successors)


def _independent_count(successors: list[list[int]]) -> int:
    """Walks of length 1 to n from node 0 ending at a node without successors, by matrix powers."""
    n = len(successors)
    sinks = [i for i in range(n) if not successors[i]]
    row = [1 if i == 0 else 0 for i in range(n)]
    total = 0
    for _ in range(n):
        row = [sum(row[i] for i in range(n) if j in successors[i]) for j in range(n)]
        total += sum(row[s] for s in sinks)
    return total


def test_long_paths_are_refused_by_their_stages_in_all() -> None:
    """128 paths continuing into a 240-node chain stay under the node and path limits but not the stage limit."""
    successors = [[1, 2]]
    for i in range(7):
        successors += [[2 * i + 3, 2 * i + 4], [2 * i + 3, 2 * i + 4]] if i < 6 else [[15], [15]]
    successors += [[i + 1] for i in range(15, 255)] + [[]]
    nodes = [AdjacencyNode(to=tuple(s), operation=f"op-{i}" if i else "") for i, s in enumerate(successors)]
    assert (len(nodes), count_paths(successors)) == (256, MAX_PATHS)
    [problem] = problems(nodes)
    assert problem.node is None
    assert f"the 128 paths have {count_stages(successors)} stages in all; at most {MAX_STAGES}" in problem.message


@given(dags())
def test_enumerated_paths_are_exactly_the_start_to_sink_paths(successors: list[list[int]]) -> None:
    """Each path starts at 0, follows edges, ends at a sink, appears once; their number is counted independently."""
    paths = enumerate_paths(successors, limit=10**6)
    for path in paths:
        assert path[0] == 0
        assert len(path) >= 2
        assert not successors[path[-1]]
        assert all(b in successors[a] for a, b in itertools.pairwise(path))
    assert len(set(paths)) == len(paths)
    assert len(paths) == count_paths(successors) == _independent_count(successors)
    assert count_stages(successors) == sum(len(p) - 1 for p in paths)


@given(dags())
def test_paths_sharing_a_prefix_are_adjacent(successors: list[list[int]]) -> None:
    """Once a path leaves a prefix, no later path begins with it again (depth-first order)."""
    paths = enumerate_paths(successors, limit=10**6)
    left: set[tuple[int, ...]] = set()
    for previous, path in itertools.pairwise(paths):
        common = next((k for k, (a, b) in enumerate(zip(previous, path, strict=False)) if a != b), 0)
        left.update(previous[: k + 1] for k in range(common, len(previous)))
        assert not any(path[: k + 1] in left for k in range(len(path)))


@given(dags())
def test_random_reachable_dags_are_valid_graphs(successors: list[list[int]]) -> None:
    """A DAG whose nodes are all reachable from 0 is valid exactly when it has at least two nodes."""
    nodes = [AdjacencyNode(to=tuple(to), operation=f"op-{i}" if i else "") for i, to in enumerate(successors)]
    reachable = {p for path in enumerate_paths(successors, limit=10**6) for p in path} | {0}
    unreachable = set(range(len(successors))) - reachable
    found = problems(nodes)
    too_big = count_paths(successors) > MAX_PATHS or count_stages(successors) > MAX_STAGES
    if len(successors) < 2 or (not unreachable and too_big):
        assert [p.node for p in found] == [None]
    else:
        assert {p.node for p in found} == unreachable
        assert all(p.field == "" and "is not reachable from the start node 0" in p.message for p in found)


# ---------------------------------------------------------------------------------------------- bounded


def _said(found: tuple[GraphProblem, ...]) -> int:
    """The bytes of what the controller writes of ``found``: each problem's path and message."""
    return len("; ".join(f"{p.path()}: {p.message}" for p in found).encode())


def test_an_edge_listed_200000_times_is_one_problem() -> None:
    """A node listing its successor 200,000 times (stored without the webhook) is one problem, at the second
    mention, saying how many times: not 199,999 of them (13 MB in the OperationSet's status)."""
    nodes = [AdjacencyNode(to=(1,) * 200_000), AdjacencyNode(operation="a")]
    [problem] = problems(nodes)
    assert (problem.node, problem.field) == (0, "to[1]")
    assert problem.message == "node 0 lists node 1 200000 times"


def test_a_bad_successor_listed_again_and_again_is_one_problem() -> None:
    """A successor that does not exist, or is the node itself, is said once with how often it is listed."""
    nodes = [AdjacencyNode(to=(1, 7, 7, 7)), AdjacencyNode(operation="a", to=(1, 1))]
    assert [(p.node, p.field, p.message) for p in problems(nodes)] == [
        (0, "to[1]", "node 0 leads to node 7 (3 times), which does not exist (ids are 0 to 1)"),
        (1, "to[0]", "node 1 (a) leads to itself (2 times)"),
    ]


def test_problems_past_the_limit_are_counted_not_listed() -> None:
    """200,000 successors that do not exist: the first problems are listed and the rest counted, so what the
    controller writes stays a few kilobytes."""
    nodes = [AdjacencyNode(to=(1, *range(2, 200_001))), AdjacencyNode(operation="a")]
    found = problems(nodes)
    assert len(found) == MAX_PROBLEMS
    assert found[0].message == "node 0 leads to node 2, which does not exist (ids are 0 to 1)"
    assert found[-1] == GraphProblem(None, "", f"and {200_000 - MAX_PROBLEMS} more problems, not listed")
    assert _said(found) < 4096


def test_a_long_operation_name_is_shown_in_part() -> None:
    """An operation's name of a megabyte (no webhook checked it) is shown by its beginning and its length."""
    name = "x" * 1_000_000
    nodes = [AdjacencyNode(to=(1,), operation=name), AdjacencyNode(operation=name, to=(1,))]
    first, second = problems(nodes)
    shown = f"{'x' * 64}... (1000000 characters)"
    assert first.message == f"the start node 0 has no operation, got {shown!r}"
    assert second.message == f"node 1 ({shown}) leads to itself"


def test_paths_whose_copies_would_take_too_many_bytes_are_refused() -> None:
    """A valid graph whose node carries 150,000 dependences (KubeDiag's unused field, copied into every path)
    would make status.paths hold 300 KB: refused, naming the node and its copy's size."""
    nodes = [AdjacencyNode(to=(1,)), AdjacencyNode(operation="a", dependences=(1,) * 150_000)]
    [problem] = problems(nodes)
    assert problem.node is None
    copy = len(msgspec.json.encode(msgspec.structs.replace(nodes[1], id=1)))
    assert problem.message == (
        f"the paths would take {copy + 4} bytes in status.paths (a copy of each node on each path, node 1 (a)"
        f" {copy} bytes a copy); at most {MAX_PATHS_BYTES} are allowed"
    )


@given(dags(), st.lists(st.integers(min_value=0, max_value=3), min_size=9, max_size=9))
def test_the_paths_bytes_are_counted_exactly(successors: list[list[int]], extra: list[int]) -> None:
    """The bytes counted for status.paths, without building them, are the bytes of their JSON."""
    nodes = [
        AdjacencyNode(to=tuple(to), operation=f"op-{i}" if i else "", dependences=(0,) * extra[i] if i else ())
        for i, to in enumerate(successors)
    ]
    if count_paths(successors) > MAX_PATHS:
        return
    assert count_paths_bytes(nodes) == len(msgspec.json.encode(status_paths(nodes)))
