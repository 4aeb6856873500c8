"""Which nodes a Diagnosis runs on: its target selector resolved once, from what the API listed.

The controller reads what one kind of target needs (the Nodes a node selector matches, the Pods a
pod selector matches in the Diagnosis's namespace, or each referenced Pod, and the Nodes named or
reached through pods) and these functions decide. Every selector works, the pod selector included
(KubeDiag HEAD builds the pod selector from the node selector, so it selects nothing), and targets
that lead nowhere are said, not dropped in silence: a node that does not exist or is not an edge
node, a pod that does not exist or is not yet on a node, is named in the Diagnosis's ``Accepted``
condition (the first few, and how many more), and when nothing is left the Diagnosis fails with
that reason (KubeDiag runs forever with no node, or stays Pending on a missing pod).

Only existing edge Nodes (label ``node-role.kubernetes.io/edge``) get Tasks: every Task is an
object in etcd that the controller and every hub keep in memory, so a Diagnosis naming made-up
nodes must not cost a Task each (and a Task no agent can take only waits for its timeout). For the
same reason a Diagnosis has at most ``max_targets`` targets: one listing more node names or pod
references is refused before anything is read, and one whose selector reaches more nodes fails.

Pods: a node reached through pods runs one Task a stage (tasks are per node), carrying the first of
its pods in target order (reference order, or namespace and name for a selector), so that the
processor gets ``pod.namespace``, ``pod.name`` and ``container``. Pods are those of the Diagnosis's
own namespace, whether selected (as a Service's selector does) or referenced: a Diagnosis must not
learn whether a pod exists in a namespace it may not read, nor the pod's node. A reference to
another namespace is left out, said, and never read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from nodetask.names import is_object_name
from schemas.core import EDGE_ROLE_LABEL, Node, Pod
from schemas.diagnosis.v1 import DEFAULT_MAX_TARGETS, PodReference, Targets
from schemas.meta import LabelSelector

__all__ = ["Resolution", "listed", "readable", "requested", "resolve"]

_SHOWN: Final = 10
"""Reasons a message lists; it counts the rest, so that a condition stays small whatever the targets."""
_CLIP: Final = 200
"""Characters of a name or selector a message shows."""


def listed(reasons: Sequence[str]) -> str:
    """The first few ``reasons``, separated by semicolons, and how many more there are."""
    shown = "; ".join(reasons[:_SHOWN])
    more = len(reasons) - _SHOWN
    return f"{shown}; and {more} more" if more > 0 else shown


def _clipped(text: str) -> str:
    return text if len(text) <= _CLIP else f"{text[:_CLIP]}... ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class Resolution:
    """The target nodes in run order, the pod each one's Tasks carry, and what was left out."""

    nodes: tuple[str, ...]
    pods: Mapping[str, PodReference] = field(default_factory=lambda: MappingProxyType({}))
    skipped: tuple[str, ...] = ()
    """Why targets were left out, one sentence each (``pod default/x does not exist``)."""
    empty_reason: str = ""
    """What matched nothing, when :attr:`nodes` is empty."""
    too_many: bool = False
    """There were more targets than a Diagnosis may have (:attr:`empty_reason` says how many): no node."""


def requested(targets: Targets) -> int:
    """How many targets the spec lists itself: its node names or pod references, each once; 0 for a selector.

    The controller reads nothing for a Diagnosis listing more than it may have.
    """
    if targets.node_selector is not None:
        return 0
    if targets.node_names:
        return len(dict.fromkeys(targets.node_names))
    if targets.pod_selector is not None:
        return 0
    return len(dict.fromkeys((ref.namespace, ref.name) for ref in targets.pod_references))


def readable(targets: Targets, *, namespace: str) -> tuple[PodReference, ...]:
    """The pod references the controller may read: those of the Diagnosis's ``namespace``, once each."""
    own: dict[tuple[str, str], PodReference] = {}
    for ref in targets.pod_references:
        if ref.namespace == namespace:
            own.setdefault((ref.namespace, ref.name), ref)
    return tuple(own.values())


def _too_many(what: str, max_targets: int) -> Resolution:
    reason = f"{what}, more than the {max_targets} a Diagnosis may have (the controller's diagnosisMaxTargets)"
    return Resolution((), empty_reason=reason, too_many=True)


def resolve(
    targets: Targets,
    *,
    namespace: str,
    nodes: Iterable[Node] = (),
    pods: Iterable[Pod] = (),
    max_targets: int = DEFAULT_MAX_TARGETS,
) -> Resolution:
    """The nodes ``targets`` select, given the Nodes and Pods the controller read for them.

    ``nodes``: what the node selector's list returned, or, for names and pods, those of the named
    nodes and of the pods' nodes that exist; ``pods``: what the pod selector's list in ``namespace``
    returned, or the referenced pods that exist. Each is filtered again here, so extra objects change
    nothing. Node names are taken once each, in order; a name no node can have, a node that does not
    exist and one that is not an edge node are left out and said.
    """
    count = requested(targets)
    if count > max_targets:
        what = "node names" if targets.node_names else "pod references"
        return _too_many(f"it lists {count} {what}", max_targets)
    known = {n.metadata.name: n for n in nodes}
    if targets.node_selector is not None:
        return _by_node_selector(targets.node_selector, known, max_targets)
    if targets.node_names:
        return _by_names(targets.node_names, known)
    if targets.pod_selector is not None:
        selector = targets.pod_selector
        selected = sorted(
            (p for p in pods if p.metadata.namespace == namespace and selector.matches(p.metadata.labels)),
            key=lambda p: p.metadata.name,
        )
        refs = [PodReference(namespace=namespace, name=p.metadata.name) for p in selected]
        what = f"the pod selector {_shown(selector)} matched no pod in namespace {namespace}"
        found = {(p.metadata.namespace, p.metadata.name): p for p in selected}
        return _by_pods(refs, found, known, what, max_targets)
    if not targets.pod_references:
        return Resolution((), empty_reason="the target selector selects nothing")
    outside = [
        f"pod {_clipped(f'{ref.namespace}/{ref.name}')} is not in the Diagnosis's namespace {namespace}"
        for ref in targets.pod_references
        if ref.namespace != namespace
    ]
    own = readable(targets, namespace=namespace)
    found = {(p.metadata.namespace, p.metadata.name): p for p in pods if p.metadata.namespace == namespace}
    return _by_pods(own, found, known, "", max_targets, skipped=outside)


def _by_node_selector(selector: LabelSelector, known: Mapping[str, Node], max_targets: int) -> Resolution:
    matched = sorted(name for name, n in known.items() if selector.matches(n.metadata.labels))
    names = tuple(name for name in matched if known[name].is_edge)
    skipped = tuple(_not_edge(name) for name in matched if not known[name].is_edge)
    if len(names) > max_targets:
        return _too_many(f"its node selector matches {len(names)} edge nodes", max_targets)
    if names:
        return Resolution(names, skipped=skipped)
    if skipped:
        reason = f"the node selector {_shown(selector)} matched no edge node: {listed(skipped)}"
    else:
        reason = f"the node selector {_shown(selector)} matched no node"
    return Resolution((), skipped=skipped, empty_reason=reason)


def _by_names(names: Sequence[str], known: Mapping[str, Node]) -> Resolution:
    kept: list[str] = []
    left: list[str] = []
    for name in dict.fromkeys(names):
        problem = _node_problem(name, known)
        if problem is None:
            kept.append(name)
        else:
            left.append(problem)
    if kept:
        return Resolution(tuple(kept), skipped=tuple(left))
    return Resolution((), skipped=tuple(left), empty_reason=f"no target node: {listed(left)}")


def _not_edge(name: str) -> str:
    return f"node {_clipped(name)} is not an edge node (label {EDGE_ROLE_LABEL})"


def _node_problem(name: str, known: Mapping[str, Node]) -> str | None:
    """Why the node ``name`` gets no Task, or None when it does."""
    if not is_object_name(name):
        return f"{_clipped(repr(name))} is not a node name"
    node = known.get(name)
    if node is None:
        return f"node {_clipped(name)} does not exist"
    return None if node.is_edge else _not_edge(name)


def _by_pods(
    refs: Sequence[PodReference],
    found: Mapping[tuple[str, str], Pod],
    known: Mapping[str, Node],
    what: str,
    max_targets: int,
    *,
    skipped: Sequence[str] = (),
) -> Resolution:
    on_node: dict[str, PodReference] = {}
    left = list(skipped)
    for ref in refs:
        pod = found.get((ref.namespace, ref.name))
        shown = _clipped(f"{ref.namespace}/{ref.name}")
        if pod is None:
            left.append(f"pod {shown} does not exist")
        elif not pod.spec.node_name:
            left.append(f"pod {shown} is not on a node yet")
        elif pod.spec.node_name not in on_node:
            problem = _node_problem(pod.spec.node_name, known)
            if problem is None:
                on_node[pod.spec.node_name] = ref
            else:
                left.append(f"pod {shown} is on a node that gets no Task: {problem}")
    if len(on_node) > max_targets:
        return _too_many(f"its pods are on {len(on_node)} nodes", max_targets)
    if on_node:
        return Resolution(tuple(on_node), MappingProxyType(on_node), tuple(left))
    reason = listed(left) if refs or left else what
    return Resolution((), skipped=tuple(left), empty_reason=f"no target node: {reason}")


def _shown(selector: LabelSelector) -> str:
    query = selector.to_query()
    return _clipped(repr(query)) if query else "{} (everything)"
