"""Action flows: which action follows which, as immutable, validated data.

A node task is a walk through a small directed graph. Every action has at most one successor on
success and one on failure; an action is *final* when the edge its result would take is missing.
KubeEdge keeps this as a mutable pointer graph searched recursively and answers ``nil`` for an
unknown name; here a flow is checked once, when it is defined, and an unknown name raises.

This module is pure: no I/O, no clock. The cloud uses it to classify reports, the edge to walk the
flow, and later the diagnosis pipelines compile their operation paths into the same shape.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import msgspec

__all__ = ["Flow", "FlowError", "Step", "UnknownActionError"]


class FlowError(ValueError):
    """A flow definition is inconsistent (dangling target, cycle, unreachable action)."""


class UnknownActionError(KeyError):
    """An action name that the flow does not contain."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown action"


class Step(msgspec.Struct, frozen=True):
    """The edges leaving one action: where to go on success and on failure (None: nowhere)."""

    on_success: str | None = None
    on_failure: str | None = None


@dataclass(frozen=True, slots=True)
class Flow:
    """An immutable, validated action graph with a designated first action.

    Errors:
        :class:`FlowError` at construction when a target does not exist, the graph has a cycle or
        an action cannot be reached from ``first``.
    """

    name: str
    first: str
    steps: Mapping[str, Step] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Freeze the mapping so that a flow shared by all tasks cannot be changed by one of them.
        object.__setattr__(self, "steps", MappingProxyType(dict(self.steps)))
        if self.first not in self.steps:
            raise FlowError(f"flow {self.name}: first action {self.first!r} is not one of its steps")
        for action, step in self.steps.items():
            for edge, target in (("success", step.on_success), ("failure", step.on_failure)):
                if target is not None and target not in self.steps:
                    raise FlowError(f"flow {self.name}: {action} -{edge}-> {target!r}, which is not a step")
        self._check_acyclic()
        unreachable = set(self.steps) - set(self._reachable())
        if unreachable:
            raise FlowError(f"flow {self.name}: unreachable from {self.first}: {', '.join(sorted(unreachable))}")

    def _reachable(self) -> Iterator[str]:
        seen: set[str] = set()
        todo = [self.first]
        while todo:
            action = todo.pop()
            if action in seen:
                continue
            seen.add(action)
            yield action
            step = self.steps[action]
            todo.extend(t for t in (step.on_success, step.on_failure) if t is not None)

    def _check_acyclic(self) -> None:
        # Iterative three-colour DFS: flows may later be compiled from user data, so no recursion.
        state: dict[str, int] = {}
        for root in self.steps:
            if state.get(root):
                continue
            stack: list[tuple[str, list[str]]] = [(root, self._targets(root))]
            state[root] = 1
            while stack:
                action, pending = stack[-1]
                if not pending:
                    state[action] = 2
                    stack.pop()
                    continue
                target = pending.pop()
                if state.get(target) == 1:
                    path = [a for a, _ in stack] + [target]
                    raise FlowError(f"flow {self.name}: cycle {' -> '.join(path[path.index(target) :])}")
                if not state.get(target):
                    state[target] = 1
                    stack.append((target, self._targets(target)))

    def _targets(self, action: str) -> list[str]:
        step = self.steps[action]
        return [t for t in (step.on_success, step.on_failure) if t is not None]

    def step(self, action: str) -> Step:
        """The edges of ``action``; raises :class:`UnknownActionError` for a name not in the flow."""
        try:
            return self.steps[action]
        except KeyError:
            raise UnknownActionError(
                f"invalid {self.name} action {action!r} (known: {', '.join(self.steps)})"
            ) from None

    def next(self, action: str, ok: bool) -> str | None:
        """The action that follows ``action`` given its result, or None when the task ends there."""
        step = self.step(action)
        return step.on_success if ok else step.on_failure

    def is_final(self, action: str, ok: bool) -> bool:
        """KubeEdge's rule: final iff (ok and no success edge) or (not ok and no failure edge)."""
        return self.next(action, ok) is None

    def __contains__(self, action: object) -> bool:
        return action in self.steps

    @property
    def actions(self) -> tuple[str, ...]:
        """All actions, in definition order."""
        return tuple(self.steps)
