"""An OperationSet's paths compiled into one action flow, each shared prefix one action.

A diagnosis tries its paths in order. A path is a sequence of stages: a stage that passes leads to
the path's next stage, the last stage passing ends the run as Succeeded, and a stage that fails fails
every path through it. KubeDiag then starts the next path from its first stage, re-running what that
path shares with the one that failed; here the run goes on at the first stage the next path does not
share with it, because the shared stages have already passed.

Action names: an action is a path *prefix*. It is named ``p<j>s<k>``: stage ``k`` (from 0, the start
node left out) of path ``j``, where ``j`` is the *first* path beginning with that prefix, so every
later path sharing the prefix shares the action. ``(j, k)`` is KubeDiag's checkpoint position
(``pathIndex``, ``nodeIndex``) of the stage; the names are short, bounded and valid in object names
and label values, unlike the node ids along a prefix (up to 255 of them). This needs paths sharing a
prefix to be adjacent in the list, which the depth-first order of
:func:`schemas.diagnosis.graph.enumerate_paths` guarantees and :func:`compile_paths` checks: with
interleaved paths the stage to run after a failure would depend on more than the failed stage.

Edges, for the prefix ``p<j>s<k>`` that paths ``j..last`` of the list begin with:

- success: ``p<j>s<k+1>``, the next stage of path ``j``; none if path ``j`` ends there (the run
  succeeded);
- failure: ``p<last+1>s<c>``, where ``c`` is how many stages paths ``last`` and ``last + 1`` share:
  those passed already; none if ``last`` is the last path (the run failed).

The flow is walked once per Diagnosis (a stage's verdict aggregates its Tasks over all target
nodes), so each stage runs at most once per node. Compiling is linear in the total length of the
paths, which admission bounds (:data:`schemas.diagnosis.graph.MAX_STAGES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from nodetask.flow import Flow, Step, UnknownActionError
from schemas.diagnosis.v1 import Path

__all__ = ["PathFlow", "Stage", "action_name", "compile_paths"]


def action_name(path_index: int, node_index: int) -> str:
    """The action of stage ``node_index`` of path ``path_index`` when that path is the first through it."""
    return f"p{path_index}s{node_index}"


@dataclass(frozen=True, slots=True)
class Stage:
    """One action of the flow: a path prefix and the operation its last node runs."""

    action: str
    node: int
    """The graph node this stage runs."""
    operation: str
    depth: int
    """The stage's index within its paths (KubeDiag's ``checkpoint.nodeIndex``)."""
    first_path: int
    """The first path (index in the list) that begins with this prefix: the one it runs for."""
    last_path: int
    """The last such path; a failure here fails paths ``first_path`` to ``last_path``."""


@dataclass(frozen=True, slots=True)
class PathFlow:
    """The compiled flow with what each of its actions stands for."""

    flow: Flow
    paths: tuple[tuple[int, ...], ...]
    """The paths as node ids, in the order they are tried."""
    stages: Mapping[str, Stage] = field(default_factory=dict)

    def stage(self, action: str) -> Stage:
        """The stage of an action; raises :class:`UnknownActionError` naming the flow."""
        self.flow.step(action)
        return self.stages[action]

    def prefix(self, action: str) -> tuple[int, ...]:
        """The graph node ids from the first stage to this one."""
        stage = self.stage(action)
        return self.paths[stage.first_path][: stage.depth + 1]

    def action_at(self, path_index: int, node_index: int) -> str:
        """The action that runs stage ``node_index`` of path ``path_index`` (a checkpoint's position).

        A stage that path shares with an earlier one is that earlier path's action.
        """
        if not 0 <= path_index < len(self.paths) or not 0 <= node_index < len(self.paths[path_index]):
            raise UnknownActionError(f"no stage {node_index} on path {path_index} ({len(self.paths)} paths)")
        first = path_index
        while first > 0 and _common(self.paths[first - 1], self.paths[path_index]) > node_index:
            first -= 1
        return action_name(first, node_index)


class _Prefix:
    """A node of the trie of the paths: one prefix, the paths through it, and its next nodes."""

    __slots__ = ("closed", "depth", "first", "full", "last", "next")

    def __init__(self, first: int, depth: int) -> None:
        self.first = first
        self.last = first
        self.depth = depth
        self.next: dict[int, _Prefix] = {}
        self.full = False  # a path ends here
        self.closed = False  # a later path left it: no path after that may begin with it


def _ids(paths: Sequence[Path]) -> tuple[tuple[int, ...], ...]:
    out = []
    for i, path in enumerate(paths):
        if not path:
            raise ValueError(f"path {i} has no stage")
        ids = []
        for node in path:
            if node.id is None:
                raise ValueError(f"path {i} has a node without an id (operation {node.operation!r})")
            ids.append(node.id)
        out.append(tuple(ids))
    return tuple(out)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _trie(ids: tuple[tuple[int, ...], ...], name: str) -> tuple[list[_Prefix], list[int]]:
    """Every prefix in the order first reached, and how many stages each path shares with the next."""
    root = _Prefix(first=-1, depth=-1)
    prefixes: list[_Prefix] = []
    shared: list[int] = []
    on_previous: list[_Prefix] = []
    for j, path in enumerate(ids):
        if j:
            shared.append(_common(ids[j - 1], path))
            for prefix in on_previous[shared[-1] :]:
                prefix.closed = True
        here, on_previous = root, []
        for depth, node in enumerate(path):
            if here.full:
                raise ValueError(f"{name}: path {here.first} is the beginning of path {j}")
            child = here.next.get(node)
            if child is None:
                child = here.next[node] = _Prefix(first=j, depth=depth)
                prefixes.append(child)
            elif child.closed:
                raise ValueError(
                    f"{name}: paths {child.last} and {j} begin with stage {depth} of path {child.first} but path "
                    f"{child.last + 1} does not; paths sharing a prefix must be adjacent"
                )
            child.last = j
            on_previous.append(child)
            here = child
        if here.full:
            raise ValueError(f"{name}: paths {here.first} and {j} are the same")
        if here.next:
            raise ValueError(f"{name}: path {j} is the beginning of path {here.first}")
        here.full = True
    return prefixes, shared


def compile_paths(paths: Sequence[Path], *, name: str = "diagnosis") -> PathFlow:
    """One flow trying ``paths`` (``status.paths`` of an OperationSet) in order, shared prefixes once.

    Errors: ValueError when there is no path, a path is empty, repeated or the beginning of another,
    a node has no id or two operations, or paths sharing a prefix are not adjacent.
    """
    ids = _ids(paths)
    if not ids:
        raise ValueError(f"{name}: no path to compile")
    operations: dict[int, str] = {}
    for path_ids, nodes in zip(ids, paths, strict=True):
        for i, node in zip(path_ids, nodes, strict=True):
            if operations.setdefault(i, node.operation) != node.operation:
                raise ValueError(f"{name}: node {i} has two operations, {operations[i]!r} and {node.operation!r}")
    prefixes, shared = _trie(ids, name)
    steps: dict[str, Step] = {}
    stages: dict[str, Stage] = {}
    for prefix in prefixes:
        action = action_name(prefix.first, prefix.depth)
        on_success = None if prefix.full else action_name(prefix.first, prefix.depth + 1)
        on_failure = action_name(prefix.last + 1, shared[prefix.last]) if prefix.last + 1 < len(ids) else None
        steps[action] = Step(on_success=on_success, on_failure=on_failure)
        node_id = ids[prefix.first][prefix.depth]
        stages[action] = Stage(
            action=action,
            node=node_id,
            operation=operations[node_id],
            depth=prefix.depth,
            first_path=prefix.first,
            last_path=prefix.last,
        )
    flow = Flow(name=name, first=action_name(0, 0), steps=steps)
    return PathFlow(flow=flow, paths=ids, stages=MappingProxyType(stages))
