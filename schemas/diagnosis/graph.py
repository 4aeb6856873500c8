"""An OperationSet's graph: what makes it valid, and its paths from the start node to each end.

Pure functions over the adjacency list, shared by admission and the controller. Beyond KubeDiag's
graph builder: every problem is reported at once and names its node (KubeDiag stops at the first one,
writes no condition and retries forever); reachability is checked as such rather than as "indegree
above 0" (the two agree only on acyclic graphs, so an unreachable cycle was reported as a cycle);
a node leading to itself, to a node that does not exist, or to one node twice is an error here
(gonum panics on the first, KubeDiag indexes past its list on the second); the number of nodes,
paths and stages, and the bytes of the paths' copies, are bounded (KubeDiag's enumeration is
exponential in the worst case, and its status, a copy of every path, can outgrow what etcd stores).

What the problems say is bounded as well, since the controller writes it into the OperationSet's
status, where a graph stored without the validating webhook must not make it too large to write: a
node listing one successor many times is one problem, at most :data:`MAX_PROBLEMS` are listed (and
the rest counted), and an operation's name is shown only in part when long.

Path order: KubeDiag's builder (a Kahn-style walk over gonum's map-backed adjacency) finds the same
set of paths in an order that changes between runs, and its own test compares them as sets. Here the
order is fixed as depth-first, successors in ``to`` order, so that paths sharing a prefix are
adjacent: that is what lets a shared prefix run once (``flows/diagnosis/paths.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from schemas.diagnosis.v1 import AdjacencyNode, Path

__all__ = [
    "MAX_NODES",
    "MAX_PATHS",
    "MAX_PATHS_BYTES",
    "MAX_PROBLEMS",
    "MAX_STAGES",
    "GraphProblem",
    "count_paths",
    "count_paths_bytes",
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
MAX_PATHS_BYTES: Final = 256 * 1024
"""Bytes of JSON of the paths' copies of their nodes: what ``status.paths`` of an OperationSet, and at
most ``failedPaths`` of a Diagnosis, hold. A copy carries the node's successors and ``dependences``,
which only this bounds."""
MAX_PROBLEMS: Final = 20
"""Problems :func:`problems` lists; it counts the rest."""
_NAME_SHOWN: Final = 64
"""Characters of an operation's name a problem shows."""


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


def _shown(operation: str) -> str:
    if len(operation) <= _NAME_SHOWN:
        return operation
    return f"{operation[:_NAME_SHOWN]}... ({len(operation)} characters)"


def _name(nodes: Sequence[AdjacencyNode], i: int) -> str:
    return f"node {i} ({_shown(nodes[i].operation)})" if nodes[i].operation else f"node {i}"


def _node_problems(nodes: Sequence[AdjacencyNode]) -> list[GraphProblem]:
    out: list[GraphProblem] = []
    for i, node in enumerate(nodes):
        if node.id is not None and node.id != i:
            out.append(GraphProblem(i, "id", f"node {i} has id {node.id}: ids are list positions, so {i} or none"))
        if i == 0 and node.operation:
            out.append(
                GraphProblem(0, "operation", f"the start node 0 has no operation, got {_shown(node.operation)!r}")
            )
        if i == 0 and node.dependences:
            out.append(GraphProblem(0, "dependences", "the start node 0 has no dependences"))
        if i > 0 and not node.operation:
            out.append(GraphProblem(i, "operation", f"node {i} has no operation (only the start node 0 has none)"))
        out.extend(_edge_problems(nodes, i))
    return out


def _edge_problems(nodes: Sequence[AdjacencyNode], i: int) -> list[GraphProblem]:
    """What is wrong with node ``i``'s successors, each bad successor said once however often it is listed."""
    n = len(nodes)
    mentions: dict[int, list[int]] = {}  # a successor's first two positions in ``to``
    counts = Counter(nodes[i].to)
    for k, target in enumerate(nodes[i].to):
        at = mentions.setdefault(target, [])
        if len(at) < 2:
            at.append(k)
    found: list[tuple[int, str]] = []
    for target, at in mentions.items():
        times = counts[target]
        listed = "" if times == 1 else f" ({times} times)"
        if not 0 <= target < n:
            message = f"leads to node {target}{listed}, which does not exist (ids are 0 to {n - 1})"
        elif target == i:
            message = f"leads to itself{listed}"
        elif target == 0:
            message = f"leads back to the start node 0{listed}, which must have no incoming edge"
        elif times > 1:
            found.append((at[1], f"lists node {target} {'twice' if times == 2 else f'{times} times'}"))
            continue
        else:
            continue
        found.append((at[0], message))
    return [GraphProblem(i, f"to[{k}]", f"{_name(nodes, i)} {message}") for k, message in sorted(found)]


def _valid_edges(nodes: Sequence[AdjacencyNode]) -> list[list[int]]:
    """Successor lists without the edges :func:`_node_problems` reports, so each fault is said once."""
    n = len(nodes)
    edges: list[list[int]] = []
    for i, node in enumerate(nodes):
        kept = [t for t in dict.fromkeys(node.to) if 0 < t < n and t != i]
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
        else:
            out.extend(_size_problems(nodes, edges))
    if len(out) > MAX_PROBLEMS:
        rest = len(out) - MAX_PROBLEMS + 1
        out[MAX_PROBLEMS - 1 :] = [GraphProblem(None, "", f"and {rest} more problems, not listed")]
    return tuple(out)


def _size_problems(nodes: Sequence[AdjacencyNode], successors: Sequence[Sequence[int]]) -> list[GraphProblem]:
    """The paths' copies of their nodes (``status.paths``) over :data:`MAX_PATHS_BYTES`, as a problem."""
    total, copies = _paths_bytes(nodes, successors)
    if total <= MAX_PATHS_BYTES:
        return []
    largest = max(copies, key=lambda i: copies[i])
    message = (
        f"the paths would take {total} bytes in status.paths (a copy of each node on each path, {_name(nodes, largest)}"
        f" {copies[largest]} bytes a copy); at most {MAX_PATHS_BYTES} are allowed"
    )
    return [GraphProblem(None, "", message)]


def _paths_bytes(nodes: Sequence[AdjacencyNode], successors: Sequence[Sequence[int]]) -> tuple[int, dict[int, int]]:
    """The bytes of :func:`status_paths` as JSON, and of each node's copy, counted without building them:
    each node's copy times the paths through it, and the brackets and commas."""
    order = _order_from_start(successors)  # each node after its successors
    onward: dict[int, int] = {}  # paths from a node to a last node
    for node in order:
        targets = successors[node]
        onward[node] = sum(onward[t] for t in targets) if targets else 1
    leading = dict.fromkeys(order, 0)  # paths from the start to a node
    leading[0] = 1
    for node in reversed(order):
        for target in successors[node]:
            leading[target] += leading[node]
    copies = {i: len(msgspec.json.encode(msgspec.structs.replace(nodes[i], id=i))) for i in order if i}
    if not successors[0]:
        return 2, copies  # no path: []
    # [path,path,...], each path [copy,copy,...]: a comma or closing bracket after each copy.
    total = 1 + 2 * onward[0] + sum(leading[i] * onward[i] * (size + 1) for i, size in copies.items())
    return total, copies


def count_paths_bytes(nodes: Sequence[AdjacencyNode]) -> int:
    """The bytes of JSON :func:`status_paths` of ``nodes`` takes, in linear time. Errors as
    :func:`enumerate_paths`; call it on a graph without edge problems."""
    return _paths_bytes(nodes, [node.to for node in nodes])[0]


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
