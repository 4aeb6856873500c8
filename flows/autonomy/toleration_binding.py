"""OpenYurt's pod binding, without its panic: a Node's autonomy duration becomes its Pods' eviction grace.

A Node annotated ``node.openyurt.io/autonomy-duration`` (and asking for autonomy with it) has the
``NoExecute`` tolerations ``node.kubernetes.io/not-ready`` and ``node.kubernetes.io/unreachable`` of
the Pods bound to it (``spec.nodeName``) set to that duration: a heartbeat lost for less long is a
network partition and evicts nothing; for longer, the node is gone and its Pods are evicted. A
duration of zero or less means forever, as in OpenYurt: the tolerations lose their
``tolerationSeconds``, which Kubernetes reads as "tolerate for ever". A positive duration becomes
whole seconds rounded up (OpenYurt truncates, so ``500ms`` would evict at once), at most Go's
longest duration. The seed's ``node.beta.openyurt.io/autonomy: "true"`` alone changes no Pod (the
issue binds only nodes with a duration); with both, the seed's wins as in OpenYurt: forever.

Unlike OpenYurt, only Pods whose namespace opts in (:func:`opted_in`) are bound: otherwise whoever
may patch a Node would decide how long every other namespace's Pods on it survive an outage (a
second, or for ever). A Pod in any other namespace is held to no binding, so one bound earlier gets
its originals back and one never bound is never written.

Each toleration's original seconds are saved first, once, in OpenYurt's Pod annotations
(``apps.openyurt.io/original-not-ready-toleration-duration`` and ``...-unreachable-...``: whole
seconds, or ``infinite`` for a toleration without seconds, which OpenYurt's first version
dereferenced and crashed on). When the Node stops asking (either annotation removed or unparsable),
the originals are written back exactly and the annotations removed, in the same patch; so an
annotation present means "bound, and these were the values before".

What the API server allows shapes the rest (tested against it): a Pod's existing tolerations may
not be removed or changed except for their ``tolerationSeconds`` (a 422; the DefaultTolerationSeconds
admission plugin, which also runs on updates, even puts the two defaults back), and new ones could
be added but never taken away on restore; so only tolerations the Pod already has are changed, and
only their seconds.
A Pod without them is left alone (the DefaultTolerationSeconds admission plugin gives every Pod
both, 300 s). Left alone as well: DaemonSet Pods (they tolerate these taints for ever by design;
a duration would make them evictable), mirror Pods, and Pods being deleted. A Pod whose state
cannot round-trip (two tolerations of one key with different seconds, a saved value that does not
parse) is refused with a reason, never half-bound.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

import msgspec

from nodetask.autonomy import BINDABLE_LABEL, DURATION_ANNOTATION, autonomy_request
from nodetask.names import clip
from schemas.core import Node, Pod, Toleration

__all__ = [
    "FOREVER",
    "NOT_BOUND",
    "NOT_READY",
    "NOT_RESTORED",
    "ORIGINAL_ANNOTATIONS",
    "UNREACHABLE",
    "Binding",
    "BoundPod",
    "Rebind",
    "Refusal",
    "binding_for",
    "bound_pod",
    "opted_in",
    "rebind",
    "whole_seconds",
]

NOT_READY: Final = "node.kubernetes.io/not-ready"
UNREACHABLE: Final = "node.kubernetes.io/unreachable"
NO_EXECUTE: Final = "NoExecute"
ORIGINAL_ANNOTATIONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        NOT_READY: "apps.openyurt.io/original-not-ready-toleration-duration",
        UNREACHABLE: "apps.openyurt.io/original-unreachable-toleration-duration",
    }
)
"""Per taint key, the Pod annotation holding its toleration's seconds before the binding (OpenYurt's names)."""
FOREVER: Final = "infinite"
"""The saved value of a toleration that had no seconds (OpenYurt's)."""
MAX_SECONDS: Final = 9_223_372_036
"""Go's longest ``time.Duration``, in whole seconds."""
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
NOT_BOUND: Final = "TolerationsNotBound"
NOT_RESTORED: Final = "TolerationsNotRestored"

_WHOLE: Final = re.compile(r"-?[0-9]{1,19}")


@dataclass(frozen=True, slots=True)
class Binding:
    """What a Node asks of its Pods' not-ready and unreachable tolerations."""

    seconds: int | None
    """``tolerationSeconds``; None: no seconds, tolerated for ever."""


def whole_seconds(duration: float | None) -> int | None:
    """A positive duration as ``tolerationSeconds`` (rounded up, capped); None (forever) stays None."""
    if duration is None:
        return None
    return min(max(1, math.ceil(duration)), MAX_SECONDS)


def binding_for(node: Node | None) -> Binding | None:
    """The binding ``node`` asks for, or None (no such Node, no duration annotation, or no request)."""
    if node is None or DURATION_ANNOTATION not in node.metadata.annotations:
        return None
    request = autonomy_request(node.metadata.annotations)
    if not request.requested:
        return None
    return Binding(whole_seconds(request.duration))


def opted_in(labels: Mapping[str, str]) -> bool:
    """Whether a namespace with ``labels`` lets its Pods be bound: ``BINDABLE_LABEL`` is exactly ``"true"``."""
    return labels.get(BINDABLE_LABEL) == "true"


@dataclass(frozen=True, slots=True)
class BoundPod:
    """What the binding needs of a Pod (the controller keeps this, not the whole Pod, for every bound Pod)."""

    namespace: str
    name: str
    node: str
    resource_version: str = ""
    uid: str = ""
    tolerations: tuple[Toleration, ...] = ()
    originals: Mapping[str, str] = field(default_factory=dict)
    """Its :data:`ORIGINAL_ANNOTATIONS` present, by annotation name."""
    exempt: str = ""
    """Why the binding leaves it alone, or empty."""


def bound_pod(pod: Pod) -> BoundPod:
    """The binding's view of ``pod``."""
    meta = pod.metadata
    annotations = meta.annotations
    if meta.deletion_timestamp is not None:
        exempt = "being deleted"
    elif any(ref.kind == "DaemonSet" for ref in meta.owner_references):
        exempt = "DaemonSet pod"
    elif MIRROR_ANNOTATION in annotations:
        exempt = "mirror pod"
    else:
        exempt = ""
    return BoundPod(
        namespace=meta.namespace,
        name=meta.name,
        node=pod.spec.node_name,
        resource_version=meta.resource_version,
        uid=meta.uid,
        tolerations=pod.spec.tolerations,
        originals={a: annotations[a] for a in ORIGINAL_ANNOTATIONS.values() if a in annotations},
        exempt=exempt,
    )


@dataclass(frozen=True, slots=True)
class Rebind:
    """A Pod's new tolerations, and the saved originals to add (a value) or remove (None)."""

    tolerations: tuple[Toleration, ...]
    originals: Mapping[str, str | None]
    bound: bool
    """True: the binding applied; False: the originals restored."""

    def patch(self, pod: BoundPod) -> dict[str, Any]:
        """The JSON merge patch that makes it, conditional on the version decided on.

        The tolerations go whole (a merge patch replaces a list): the condition keeps a change made
        meanwhile (a toleration added) from being undone.
        """
        metadata: dict[str, Any] = {"resourceVersion": pod.resource_version}
        if self.originals:
            metadata["annotations"] = dict(self.originals)
        return {"metadata": metadata, "spec": {"tolerations": [msgspec.to_builtins(t) for t in self.tolerations]}}


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a Pod is left as it is (an Event and a log say it; the Pod is not tried again until it changes)."""

    reason: str
    message: str


def _saved(seconds: int | None) -> str:
    return FOREVER if seconds is None else str(seconds)


def _original(text: str) -> int | None:
    if text == FOREVER:
        return None
    if _WHOLE.fullmatch(text) and -(2**63) <= int(text) < 2**63:
        return int(text)
    raise ValueError(f"{clip(text, 64)!r} is neither whole seconds nor {FOREVER!r}")


def rebind(pod: BoundPod, binding: Binding | None) -> Rebind | Refusal | None:
    """What to write on ``pod`` for its node's ``binding`` (None: not bound), or None when it is right. Pure.

    Applying the result and deciding again gives None; binding and then restoring gives back the
    tolerations the Pod had, exactly.
    """
    if pod.exempt:
        return None
    tolerations = list(pod.tolerations)
    originals: dict[str, str | None] = {}
    for key, annotation in ORIGINAL_ANNOTATIONS.items():
        at = [i for i, t in enumerate(tolerations) if t.key == key and t.effect == NO_EXECUTE]
        saved = pod.originals.get(annotation)
        if saved is None:
            if binding is None or not at:
                continue
            found = {tolerations[i].toleration_seconds for i in at}
            if len(found) > 1:
                shown = ", ".join(sorted(_saved(s) for s in found))
                return Refusal(
                    NOT_BOUND,
                    f"the {key} NoExecute tolerations have different seconds ({shown}), which one annotation "
                    "cannot keep for restoring, so they are left as they are",
                )
            originals[annotation] = _saved(found.pop())
            seconds = binding.seconds
        else:
            try:
                restored = _original(saved)
            except ValueError as exc:
                what = "cannot be restored" if binding is None else "could not be restored later"
                return Refusal(
                    NOT_RESTORED if binding is None else NOT_BOUND,
                    f"annotation {annotation}: {exc}; the {key} tolerations {what}, so they are left as they are",
                )
            if binding is None or not at:
                # Restored, or nothing left to restore: the saved value goes.
                originals[annotation] = None
            seconds = restored if binding is None else binding.seconds
        for i in at:
            tolerations[i] = msgspec.structs.replace(tolerations[i], toleration_seconds=seconds)
    changed = tuple(tolerations)
    if changed == pod.tolerations and not originals:
        return None
    return Rebind(changed, MappingProxyType(originals), bound=binding is not None)
