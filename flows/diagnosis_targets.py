"""Which nodes a Diagnosis runs on: its target selector resolved once, from what the API listed.

The controller reads what one kind of target needs (the Nodes a node selector matches, the Pods a
pod selector matches in the Diagnosis's namespace, or each referenced Pod) and these functions
decide. Every selector works, the pod selector included (KubeDiag HEAD builds the pod selector from
the node selector, so it selects nothing), and targets that lead nowhere are said, not dropped in
silence: a pod that does not exist or is not yet on a node is named in the Diagnosis's ``Accepted``
condition, and when nothing is left the Diagnosis fails with that reason (KubeDiag runs forever
with no node, or stays Pending on a missing pod).

Pods: a node reached through pods runs one Task a stage (tasks are per node), carrying the first of
its pods in target order (reference order, or namespace and name for a selector), so that the
processor gets ``pod.namespace``, ``pod.name`` and ``container``. A pod selector selects in the
Diagnosis's own namespace, as a Service's does: a Diagnosis does not learn the names of pods in
namespaces it does not name. Pod references may name any namespace, as KubeDiag's Triggers do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from nodetask.names import is_object_name
from schemas.core import Node, Pod
from schemas.diagnosis import PodReference, Targets
from schemas.meta import LabelSelector

__all__ = ["Resolution", "listed", "resolve"]

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


def resolve(
    targets: Targets,
    *,
    namespace: str,
    nodes: Iterable[Node] = (),
    pods: Iterable[Pod] = (),
) -> Resolution:
    """The nodes ``targets`` select, given the Nodes and Pods the controller read for them.

    ``nodes``: what the node selector's list returned; ``pods``: what the pod selector's list in
    ``namespace`` returned, or the referenced pods that exist. Each is filtered again here, so
    extra objects change nothing. Node names are taken as given (once each, in order), but for
    names no node can have; a node that does not exist, or has no agent, has its Tasks time out.
    """
    if targets.node_selector is not None:
        selector = targets.node_selector
        names = tuple(sorted(n.metadata.name for n in nodes if selector.matches(n.metadata.labels)))
        return Resolution(names, empty_reason="" if names else f"the node selector {_shown(selector)} matched no node")
    if targets.node_names:
        names = tuple(n for n in dict.fromkeys(targets.node_names) if is_object_name(n))
        unnamed = (n for n in dict.fromkeys(targets.node_names) if not is_object_name(n))
        skipped = tuple(f"{_clipped(repr(n))} is not a node name" for n in unnamed)
        return Resolution(names, skipped=skipped, empty_reason="" if names else f"no target node: {listed(skipped)}")
    if targets.pod_selector is not None:
        selector = targets.pod_selector
        selected = sorted(
            (p for p in pods if p.metadata.namespace == namespace and selector.matches(p.metadata.labels)),
            key=lambda p: p.metadata.name,
        )
        refs = [PodReference(namespace=namespace, name=p.metadata.name) for p in selected]
        what = f"the pod selector {_shown(selector)} matched no pod in namespace {namespace}"
        return _by_pods(refs, {(p.metadata.namespace, p.metadata.name): p for p in selected}, what)
    if targets.pod_references:
        found = {(p.metadata.namespace, p.metadata.name): p for p in pods}
        return _by_pods(targets.pod_references, found, "")
    return Resolution((), empty_reason="the target selector selects nothing")


def _by_pods(refs: Sequence[PodReference], found: Mapping[tuple[str, str], Pod], what: str) -> Resolution:
    on_node: dict[str, PodReference] = {}
    skipped: list[str] = []
    for ref in refs:
        pod = found.get((ref.namespace, ref.name))
        if pod is None:
            skipped.append(f"pod {_clipped(f'{ref.namespace}/{ref.name}')} does not exist")
        elif not pod.spec.node_name:
            skipped.append(f"pod {_clipped(f'{ref.namespace}/{ref.name}')} is not on a node yet")
        else:
            on_node.setdefault(pod.spec.node_name, ref)
    if on_node:
        return Resolution(tuple(on_node), MappingProxyType(on_node), tuple(skipped))
    reason = listed(skipped) if refs else what
    return Resolution((), skipped=tuple(skipped), empty_reason=f"no target node: {reason}")


def _shown(selector: LabelSelector) -> str:
    query = selector.to_query()
    return _clipped(repr(query)) if query else "{} (everything)"
