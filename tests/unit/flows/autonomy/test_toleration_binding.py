"""The pod binding: a node's autonomy duration on its Pods' tolerations, the originals kept and given back exactly."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from flows.autonomy.toleration_binding import (
    FOREVER,
    MAX_SECONDS,
    NOT_BOUND,
    NOT_READY,
    NOT_RESTORED,
    ORIGINAL_ANNOTATIONS,
    UNREACHABLE,
    Binding,
    BoundPod,
    Rebind,
    Refusal,
    binding_for,
    bound_pod,
    opted_in,
    rebind,
    whole_seconds,
)
from nodetask.autonomy import AUTONOMY_ANNOTATION, BINDABLE_LABEL, DURATION_ANNOTATION
from schemas.core import Node, Pod, PodSpec, Toleration
from schemas.meta import ObjectMeta, OwnerReference

NOT_READY_SAVED = ORIGINAL_ANNOTATIONS[NOT_READY]
UNREACHABLE_SAVED = ORIGINAL_ANNOTATIONS[UNREACHABLE]


@st.composite
def tolerations(draw: st.DrawFn) -> Toleration:
    effect = draw(st.sampled_from(["NoExecute", "NoSchedule", ""]))
    # The API server allows seconds only on NoExecute tolerations.
    seconds = draw(st.none() | st.integers(-5, 10**6)) if effect == "NoExecute" else None
    return Toleration(
        key=draw(st.sampled_from([NOT_READY, UNREACHABLE, "example.com/other", ""])),
        operator=draw(st.sampled_from(["Exists", "Equal", ""])),
        value=draw(st.sampled_from(["", "x"])),
        effect=effect,
        toleration_seconds=seconds,
    )


PODS = st.builds(
    lambda ts: BoundPod(namespace="default", name="p", node="edge-1", resource_version="7", tolerations=tuple(ts)),
    st.lists(tolerations(), max_size=5),
)
BINDINGS = st.builds(Binding, st.none() | st.integers(1, 10**7))


def applied(pod: BoundPod, change: Rebind) -> BoundPod:
    """``pod`` after the change's patch (annotations merged, a null removing one)."""
    originals = dict(pod.originals)
    for key, value in change.originals.items():
        if value is None:
            originals.pop(key, None)
        else:
            originals[key] = value
    return BoundPod(
        namespace=pod.namespace,
        name=pod.name,
        node=pod.node,
        resource_version=str(int(pod.resource_version) + 1),
        tolerations=change.tolerations,
        originals=originals,
    )


def settled(pod: BoundPod, binding: Binding | None) -> BoundPod | Refusal:
    """``pod`` once the binding has been applied (or refused)."""
    change = rebind(pod, binding)
    if change is None or isinstance(change, Refusal):
        return change or pod
    return applied(pod, change)


def mixed(pod: BoundPod) -> bool:
    """Whether some key has NoExecute tolerations with different seconds (the one refusal for a fresh Pod)."""
    for key in (NOT_READY, UNREACHABLE):
        found = {t.toleration_seconds for t in pod.tolerations if t.key == key and t.effect == "NoExecute"}
        if len(found) > 1:
            return True
    return False


def matched(tolerations: Sequence[Toleration]) -> list[int]:
    return [i for i, t in enumerate(tolerations) if t.key in (NOT_READY, UNREACHABLE) and t.effect == "NoExecute"]


@given(PODS, st.none() | BINDINGS)
def test_a_change_applied_asks_for_nothing_more(pod: BoundPod, binding: Binding | None) -> None:
    """Deciding again on a Pod the change was applied to gives nothing to do: the binding never writes in a loop."""
    for _ in range(2):  # a fresh pod, then one already bound or restored
        change = rebind(pod, binding)
        if not isinstance(change, Rebind):
            break
        pod = applied(pod, change)
        assert rebind(pod, binding) is None


@given(PODS, BINDINGS, st.none() | BINDINGS)
def test_binding_then_withdrawing_gives_back_the_exact_tolerations(
    pod: BoundPod, first: Binding, second: Binding | None
) -> None:
    """Bound (and maybe bound again to another duration), then withdrawn: the Pod's tolerations and
    annotations are what they were, tolerations without seconds included."""
    assume(not mixed(pod))
    bound = settled(pod, first)
    assert isinstance(bound, BoundPod)
    for i in matched(pod.tolerations):
        assert bound.tolerations[i].toleration_seconds == first.seconds
    if second is not None:
        bound = settled(bound, second)
        assert isinstance(bound, BoundPod)
    restored = settled(bound, None)
    assert isinstance(restored, BoundPod)
    assert restored.tolerations == pod.tolerations
    assert restored.originals == {}


@given(PODS, st.none() | BINDINGS)
def test_only_the_seconds_of_the_two_noexecute_tolerations_ever_change(pod: BoundPod, binding: Binding | None) -> None:
    """Every change keeps the same tolerations in the same order, changing only seconds of the matched ones:
    the only change the API server allows to a Pod's existing tolerations."""
    bound = settled(pod, binding or Binding(60))
    if isinstance(bound, Refusal):
        assert mixed(pod)
        return
    for before, after in ((pod, bound), (bound, settled(bound, None))):
        assert isinstance(after, BoundPod)
        assert len(after.tolerations) == len(before.tolerations)
        for i, (old, new) in enumerate(zip(before.tolerations, after.tolerations, strict=True)):
            assert msgspec.structs.replace(old, toleration_seconds=None) == msgspec.structs.replace(
                new, toleration_seconds=None
            )
            if i not in matched(before.tolerations):
                assert old == new


@given(PODS, st.none() | BINDINGS, st.sampled_from(["DaemonSet pod", "mirror pod", "being deleted"]))
def test_an_exempt_pod_is_never_changed(pod: BoundPod, binding: Binding | None, exempt: str) -> None:
    """DaemonSet and mirror Pods, and Pods being deleted, are left as they are."""
    pod = BoundPod(
        namespace=pod.namespace,
        name=pod.name,
        node=pod.node,
        tolerations=pod.tolerations,
        originals={NOT_READY_SAVED: "300"},
        exempt=exempt,
    )
    assert rebind(pod, binding) is None


def default_pod(seconds: int | None = 300) -> BoundPod:
    """A Pod with the two tolerations the DefaultTolerationSeconds admission plugin adds."""
    tolerations = tuple(
        Toleration(key=key, operator="Exists", effect="NoExecute", toleration_seconds=seconds)
        for key in (NOT_READY, UNREACHABLE)
    )
    return BoundPod(namespace="default", name="p", node="edge-1", resource_version="7", tolerations=tolerations)


def test_a_toleration_without_seconds_is_saved_as_infinite_and_restored_without_seconds() -> None:
    """OpenYurt's first binding crashed on a toleration without seconds: here it is saved as "infinite"."""
    pod = default_pod(None)
    change = rebind(pod, Binding(90))
    assert isinstance(change, Rebind)
    assert dict(change.originals) == {NOT_READY_SAVED: FOREVER, UNREACHABLE_SAVED: FOREVER}
    assert [t.toleration_seconds for t in change.tolerations] == [90, 90]
    patch = change.patch(pod)
    assert patch["metadata"] == {
        "resourceVersion": "7",
        "annotations": {NOT_READY_SAVED: FOREVER, UNREACHABLE_SAVED: FOREVER},
    }
    restore = rebind(applied(pod, change), None)
    assert isinstance(restore, Rebind)
    assert restore.patch(pod)["spec"]["tolerations"] == [
        {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute"},
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"},
    ]
    assert dict(restore.originals) == {NOT_READY_SAVED: None, UNREACHABLE_SAVED: None}


def test_forever_removes_the_seconds() -> None:
    """A zero duration (forever) binds the tolerations without seconds, as OpenYurt does."""
    change = rebind(default_pod(300), Binding(None))
    assert isinstance(change, Rebind)
    assert [t.toleration_seconds for t in change.tolerations] == [None, None]
    assert dict(change.originals) == {NOT_READY_SAVED: "300", UNREACHABLE_SAVED: "300"}


def test_a_second_duration_keeps_the_first_originals() -> None:
    """Rebinding to another duration changes the seconds and keeps the originals saved the first time."""
    bound = settled(default_pod(300), Binding(90))
    assert isinstance(bound, BoundPod)
    change = rebind(bound, Binding(30))
    assert isinstance(change, Rebind)
    assert dict(change.originals) == {}
    assert [t.toleration_seconds for t in change.tolerations] == [30, 30]


def test_tolerations_of_one_key_with_different_seconds_are_refused_not_half_bound() -> None:
    """Two not-ready tolerations with different seconds cannot be kept in one annotation: refused, named."""
    pod = default_pod(300)
    extra = Toleration(key=NOT_READY, operator="Exists", effect="NoExecute", toleration_seconds=60)
    pod = BoundPod(namespace="default", name="p", node="edge-1", tolerations=(*pod.tolerations, extra))
    refusal = rebind(pod, Binding(90))
    assert isinstance(refusal, Refusal)
    assert refusal.reason == NOT_BOUND
    assert "(300, 60)" in refusal.message or "(60, 300)" in refusal.message


@pytest.mark.parametrize("saved", ["soon", "1.5", "", "99999999999999999999"])
def test_an_unreadable_saved_value_is_refused_naming_the_annotation(saved: str) -> None:
    """A saved original that is neither whole seconds nor "infinite" is left alone, restoring and binding alike."""
    pod = default_pod(90)
    pod = BoundPod(
        namespace="default", name="p", node="edge-1", tolerations=pod.tolerations, originals={NOT_READY_SAVED: saved}
    )
    restore = rebind(pod, None)
    assert isinstance(restore, Refusal)
    assert restore.reason == NOT_RESTORED
    assert NOT_READY_SAVED in restore.message
    bind = rebind(pod, Binding(30))
    assert isinstance(bind, Refusal)
    assert bind.reason == NOT_BOUND


def test_a_pod_without_the_tolerations_is_left_alone_and_a_stale_saved_value_goes() -> None:
    """Nothing to bind on a Pod without the two tolerations (none is added: it could never be removed again)."""
    pod = BoundPod(namespace="default", name="p", node="edge-1")
    assert rebind(pod, Binding(90)) is None
    stale = BoundPod(namespace="default", name="p", node="edge-1", originals={UNREACHABLE_SAVED: "300"})
    change = rebind(stale, Binding(90))
    assert isinstance(change, Rebind)
    assert dict(change.originals) == {UNREACHABLE_SAVED: None}


@pytest.mark.parametrize(
    ("annotations", "binding"),
    [
        ({}, None),
        ({AUTONOMY_ANNOTATION: "true"}, None),
        ({DURATION_ANNOTATION: "90s"}, Binding(90)),
        ({DURATION_ANNOTATION: "1m30.2s"}, Binding(91)),
        ({DURATION_ANNOTATION: "300ms"}, Binding(1)),
        ({DURATION_ANNOTATION: "0"}, Binding(None)),
        ({DURATION_ANNOTATION: "-1h"}, Binding(None)),
        ({DURATION_ANNOTATION: "forever"}, None),
        ({DURATION_ANNOTATION: "90s", AUTONOMY_ANNOTATION: "true"}, Binding(None)),
        ({DURATION_ANNOTATION: "90s", AUTONOMY_ANNOTATION: "false"}, Binding(90)),
        ({DURATION_ANNOTATION: "1000000000h"}, Binding(MAX_SECONDS)),
    ],
)
def test_a_node_s_binding_comes_from_its_duration_annotation(
    annotations: dict[str, str], binding: Binding | None
) -> None:
    """Only a parsable duration binds; zero or less is forever; a positive one is rounded up to whole seconds."""
    assert binding_for(Node(metadata=ObjectMeta(name="edge-1", annotations=annotations))) == binding


def test_no_node_means_no_binding() -> None:
    """A Pod bound to a Node that does not exist (any more) is restored."""
    assert binding_for(None) is None


@given(st.floats(min_value=1e-9, max_value=1e12, allow_nan=False))
def test_a_positive_duration_never_becomes_zero_seconds(duration: float) -> None:
    """Rounded up: 300ms is 1 s, never 0 (which would evict at once)."""
    seconds = whole_seconds(duration)
    assert seconds is not None
    assert 1 <= seconds <= MAX_SECONDS
    assert seconds >= min(duration, MAX_SECONDS)


def test_the_binding_s_view_of_a_pod_knows_which_pods_to_leave_alone() -> None:
    """DaemonSet Pods, mirror Pods and Pods being deleted are exempt; others carry their saved originals."""
    spec = PodSpec(node_name="edge-1", tolerations=default_pod().tolerations)
    daemon = OwnerReference(api_version="apps/v1", kind="DaemonSet", name="ds", uid="u")
    cases = {
        "DaemonSet pod": ObjectMeta(name="a", namespace="ns", owner_references=(daemon,)),
        "mirror pod": ObjectMeta(name="b", namespace="ns", annotations={"kubernetes.io/config.mirror": "x"}),
        "being deleted": ObjectMeta(name="c", namespace="ns", deletion_timestamp="2026-01-01T00:00:00Z"),
        "": ObjectMeta(name="d", namespace="ns", annotations={NOT_READY_SAVED: "300", "other": "x"}),
    }
    for exempt, meta in cases.items():
        view = bound_pod(Pod(metadata=meta, spec=spec))
        assert view.exempt == exempt
        assert view.node == "edge-1"
    assert bound_pod(Pod(metadata=cases[""], spec=spec)).originals == {NOT_READY_SAVED: "300"}


@pytest.mark.parametrize(
    ("labels", "bindable"),
    [
        ({BINDABLE_LABEL: "true"}, True),
        ({}, False),
        ({BINDABLE_LABEL: "True"}, False),
        ({BINDABLE_LABEL: ""}, False),
        ({BINDABLE_LABEL: "false"}, False),
        ({"kubernetes.io/metadata.name": "apps"}, False),
    ],
)
def test_only_a_namespace_labelled_exactly_true_opts_in_to_the_binding(labels: dict[str, str], bindable: bool) -> None:
    """The opt-in is closed by default: no label, an empty one or any spelling but ``true`` keeps Pods unbound."""
    assert opted_in(labels) is bindable
