"""An OperationSet's graph: what makes it valid, and its paths from the start node to each end.

Pure functions over the adjacency list, shared by admission and the controller. Beyond KubeDiag's
graph builder: every problem is reported at once and names its node (KubeDiag stops at the first one,
writes no condition and retries forever); reachability is checked as such rather than as "indegree
above 0" (the two agree only on acyclic graphs, so an unreachable cycle was reported as a cycle);
a node leading to itself, to a node that does not exist, or to one node twice is an error here
(gonum panics on the first, KubeDiag indexes past its list on the second); the number of nodes,
paths and stages is bounded (KubeDiag's enumeration is exponential in the worst case, and its
status, a copy of every path, can outgrow what etcd stores).

Path order: KubeDiag's builder (a Kahn-style walk over gonum's map-backed adjacency) finds the same
set of paths in an order that changes between runs, and its own test compares them as sets. Here the
order is fixed as depth-first, successors in ``to`` order, so that paths sharing a prefix are
adjacent: that is what lets a shared prefix run once (``flows/diagnosis_paths.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from schemas.diagnosis import AdjacencyNode, Path

__all__ = [
    "MAX_NODES",
    "MAX_PATHS",
    "MAX_STAGES",
    "GraphProblem",
    "count_paths",
    "count_stages",
    "enumerate_paths",
    "problems",
    "status_paths",
]

MAX_NODES: Final = 256
MAX_PATHS: Final = 128
"""Paths are tried one after the other, each stage on every target node: more is not a diagnosis."""
MAX_STAGES: Final = 2048
"""Stages of all paths together: ``status.paths`` holds a copy of each (about 60 bytes), and the
compiled flow an action each at most."""


@dataclass(frozen=True, slots=True)
class GraphProblem:
    """One reason an adjacency list is not a valid diagnosis graph."""

    node: int | None
    """The node's position in the list; None when the list as a whole is wrong."""
    field: str
    """The part of the node at fault (``to[1]``, ``operation``), empty for the node itself."""
    message: str
    """Says what is wrong, naming the node."""

    def path(self, base: str = "spec.adjacencyList") -> str:
        """The field path of the problem, e.g. ``spec.adjacencyList[3].to[1]``."""
        if self.node is None:
            return base
        node = f"{base}[{self.node}]"
        return f"{node}.{self.field}" if self.field else node

    def __str__(self) -> str:
        return self.message


def _name(nodes: Sequence[AdjacencyNode], i: int) -> str:
    return f"node {i} ({nodes[i].operation})" if nodes[i].operation else f"node {i}"


def _node_problems(nodes: Sequence[AdjacencyNode]) -> list[GraphProblem]:
    out: list[GraphProblem] = []
    n = len(nodes)
    for i, node in enumerate(nodes):
        if node.id is not None and node.id != i:
            out.append(GraphProblem(i, "id", f"node {i} has id {node.id}: ids are list positions, so {i} or none"))
        if i == 0 and node.operation:
            out.append(GraphProblem(0, "operation", f"the start node 0 has no operation, got {node.operation!r}"))
        if i == 0 and node.dependences:
            out.append(GraphProblem(0, "dependences", "the start node 0 has no dependences"))
        if i > 0 and not node.operation:
            out.append(GraphProblem(i, "operation", f"node {i} has no operation (only the start node 0 has none)"))
        seen: set[int] = set()
        for k, target in enumerate(node.to):
            field = f"to[{k}]"
            if not 0 <= target < n:
                message = f"{_name(nodes, i)} leads to node {target}, which does not exist (ids are 0 to {n - 1})"
            elif target == i:
                message = f"{_name(nodes, i)} leads to itself"
            elif target == 0:
                message = f"{_name(nodes, i)} leads back to the start node 0, which must have no incoming edge"
            elif target in seen:
                message = f"{_name(nodes, i)} lists node {target} twice"
            else:
                seen.add(target)
                continue
            out.append(GraphProblem(i, field, message))
    return out


def _valid_edges(nodes: Sequence[AdjacencyNode]) -> list[list[int]]:
    """Successor lists without the edges :func:`_node_problems` reports, so each fault is said once."""
    n = len(nodes)
    edges: list[list[int]] = []
    for i, node in enumerate(nodes):
        kept: list[int] = []
        for target in node.to:
            if 0 < target < n and target != i and target not in kept:
                kept.append(target)
        edges.append(kept)
    return edges


def _reachable(successors: Sequence[Sequence[int]]) -> set[int]:
    seen = {0}
    todo = [0]
    while todo:
        for target in successors[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _find_cycle(successors: Sequence[Sequence[int]], roots: Sequence[int]) -> list[int] | None:
    """One cycle among the nodes reachable from ``roots``, as ``[a, b, ..., a]``, or None.

    Iterative three-colour depth-first search: the graph is user data, so no recursion.
    """
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for root in roots:
        if root in state:
            continue
        state[root] = 1
        stack: list[tuple[int, int]] = [(root, 0)]
        while stack:
            node, k = stack[-1]
            targets = successors[node]
            if k == len(targets):
                state[node] = 2
                stack.pop()
                continue
            stack[-1] = (node, k + 1)
            target = targets[k]
            if state.get(target) == 1:
                path = [n for n, _ in stack]
                return [*path[path.index(target) :], target]
            if target not in state:
                state[target] = 1
                stack.append((target, 0))
    return None


def problems(nodes: Sequence[AdjacencyNode]) -> tuple[GraphProblem, ...]:
    """Every reason ``nodes`` is not a valid diagnosis graph; empty when it is one.

    Valid: at least two nodes; node ``i`` has id ``i`` or none; the start node 0 has no operation
    and no incoming edge, every other node has an operation; every edge leads to another existing
    node, at most once; every node is reachable from the start; there is no cycle; and at most
    :data:`MAX_PATHS` paths, of :data:`MAX_STAGES` stages in all, lead from the start to a node
    without successors.
    """
    n = len(nodes)
    if n < 2:
        return (GraphProblem(None, "", f"needs at least two nodes, the start node 0 and an operation; got {n}"),)
    if n > MAX_NODES:
        return (GraphProblem(None, "", f"has {n} nodes; at most {MAX_NODES} are allowed"),)
    out = _node_problems(nodes)
    edges = _valid_edges(nodes)
    reachable = _reachable(edges)
    out.extend(
        GraphProblem(i, "", f"{_name(nodes, i)} is not reachable from the start node 0")
        for i in range(n)
        if i not in reachable
    )
    cycle = _find_cycle(edges, [0])
    if cycle is not None:
        shown = " -> ".join(str(i) for i in cycle)
        out.append(GraphProblem(cycle[0], "to", f"{_name(nodes, cycle[0])} is on the cycle {shown}"))
    if not out:
        paths, stages = _totals(edges)
        if paths > MAX_PATHS:
            message = f"{paths} paths lead from the start node to a last node; at most {MAX_PATHS} are allowed"
            out.append(GraphProblem(None, "", message))
        elif stages > MAX_STAGES:
            message = f"the {paths} paths have {stages} stages in all; at most {MAX_STAGES} are allowed"
            out.append(GraphProblem(None, "", message))
    return tuple(out)


def _order_from_start(successors: Sequence[Sequence[int]]) -> list[int]:
    """The nodes reachable from the start, each after all of its successors.

    Errors: ValueError for an empty graph, an edge to a node that does not exist, or a cycle.
    """
    if not successors:
        raise ValueError("start node not found in graph")
    n = len(successors)
    for i, targets in enumerate(successors):
        for target in targets:
            if not 0 <= target < n:
                raise ValueError(f"node {i} leads to node {target}, which does not exist")
    cycle = _find_cycle(successors, [0])
    if cycle is not None:
        raise ValueError(f"cycle {' -> '.join(map(str, cycle))}")
    order: list[int] = []
    done: set[int] = set()
    stack: list[tuple[int, int]] = [(0, 0)]
    while stack:
        node, k = stack[-1]
        targets = successors[node]
        if k == len(targets):
            stack.pop()
            if node not in done:
                done.add(node)
                order.append(node)
            continue
        stack[-1] = (node, k + 1)
        if targets[k] not in done:
            stack.append((targets[k], 0))
    return order


def _totals(successors: Sequence[Sequence[int]]) -> tuple[int, int]:
    """The number of paths from the start to a node without successors, and of their stages in all."""
    paths: dict[int, int] = {}
    stages: dict[int, int] = {}  # from a node on, the start node's own stage left out
    for node in _order_from_start(successors):
        targets = successors[node]
        paths[node] = sum(paths[t] for t in targets) if targets else 1
        stages[node] = sum(stages[t] + paths[t] for t in targets)
    return (paths[0], stages[0]) if successors[0] else (0, 0)


def count_paths(successors: Sequence[Sequence[int]]) -> int:
    """How many paths lead from the start node 0 to a node without successors, in linear time.

    A lone start node has none (KubeDiag's one-node graph has no path). Errors as
    :func:`enumerate_paths`.
    """
    return _totals(successors)[0]


def count_stages(successors: Sequence[Sequence[int]]) -> int:
    """The stages of all those paths together (the start node is not a stage), in linear time."""
    return _totals(successors)[1]


def enumerate_paths(successors: Sequence[Sequence[int]], *, limit: int = MAX_PATHS) -> tuple[tuple[int, ...], ...]:
    """Every path from the start node 0 to a node without successors, start included, depth-first.

    ``successors[i]`` is node ``i``'s ``to``. Paths sharing a prefix are adjacent, and successors
    are followed in their listed order. A lone start node has no path.

    Errors: ValueError for an empty graph ("start node not found in graph", KubeDiag's text), an edge
    to a node that does not exist, a cycle, or more than ``limit`` paths (counted before any is built).
    """
    count = count_paths(successors)
    if count > limit:
        raise ValueError(f"{count} paths lead from the start node to a last node; at most {limit} are allowed")
    paths: list[tuple[int, ...]] = []
    path = [0]
    cursors = [0]  # cursors[d]: the next successor of path[d] to follow
    while path:
        node = path[-1]
        targets = successors[node]
        if cursors[-1] < len(targets):
            target = targets[cursors[-1]]
            cursors[-1] += 1
            path.append(target)
            cursors.append(0)
            continue
        if not targets and len(path) > 1:
            paths.append(tuple(path))
        path.pop()
        cursors.pop()
    return tuple(paths)


def status_paths(nodes: Sequence[AdjacencyNode]) -> tuple[Path, ...]:
    """The paths as KubeDiag's ``status.paths`` holds them: copies of the nodes after the start.

    Each copy carries its id (its position), which KubeDiag leaves to its defaulting webhook.
    Errors: as :func:`enumerate_paths`; call it on a graph :func:`problems` accepts.
    """
    numbered = [msgspec.structs.replace(node, id=i) for i, node in enumerate(nodes)]
    return tuple(tuple(numbered[i] for i in path[1:]) for path in enumerate_paths([n.to for n in nodes]))
