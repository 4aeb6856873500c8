"""A Diagnosis's targets resolve to nodes once: every selector works, only existing edge Nodes get Tasks, a
Diagnosis has at most so many targets and reaches pods of its own namespace only, and what leads nowhere is said."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flows.diagnosis.targets import listed, readable, requested, resolve
from schemas.core import EDGE_ROLE_LABEL, Node, Pod, PodSpec
from schemas.diagnosis.v1 import PodReference, Targets
from schemas.meta import LabelSelector, ObjectMeta


def node(name: str, *, edge: bool = True, **labels: str) -> Node:
    return Node(metadata=ObjectMeta(name=name, labels={**labels, **({EDGE_ROLE_LABEL: ""} if edge else {})}))


def pod(namespace: str, name: str, on: str = "", **labels: str) -> Pod:
    return Pod(metadata=ObjectMeta(name=name, namespace=namespace, labels=labels), spec=PodSpec(node_name=on))


def test_a_node_selector_selects_matching_edge_nodes_in_name_order() -> None:
    """Edge nodes whose labels match, sorted; extra nodes the list returned change nothing; a matching node that
    is not an edge node is left out and said."""
    selector = LabelSelector(match_labels={"zone": "a"})
    nodes = [node("e2", zone="a"), node("e1", zone="a"), node("c1", zone="b"), node("m1", edge=False, zone="a")]
    found = resolve(Targets(node_selector=selector), namespace="ns", nodes=nodes)
    assert found.nodes == ("e1", "e2")
    assert found.skipped == (f"node m1 is not an edge node (label {EDGE_ROLE_LABEL})",)


def test_a_node_selector_matching_nothing_says_so() -> None:
    """No node matched: no targets, and the reason quotes the selector (and the non-edge nodes it matched)."""
    found = resolve(Targets(node_selector=LabelSelector(match_labels={"zone": "x"})), namespace="ns")
    assert found.nodes == ()
    assert found.empty_reason == "the node selector 'zone=x' matched no node"
    cloud = resolve(
        Targets(node_selector=LabelSelector(match_labels={"zone": "x"})),
        namespace="ns",
        nodes=[node("m1", edge=False, zone="x")],
    )
    assert cloud.empty_reason == (
        f"the node selector 'zone=x' matched no edge node: node m1 is not an edge node (label {EDGE_ROLE_LABEL})"
    )


def test_node_names_are_taken_once_each_in_order_but_not_impossible_missing_or_cloud_ones() -> None:
    """Duplicates count once; a name no node can have, a node that does not exist and one that is not an edge
    node are left out and said."""
    nodes = [node("a"), node("b"), node("m", edge=False)]
    found = resolve(Targets(node_names=("b", "a", "b", "Not_A_Node", "made-up", "m")), namespace="ns", nodes=nodes)
    assert found.nodes == ("b", "a")
    assert found.skipped == (
        "'Not_A_Node' is not a node name",
        "node made-up does not exist",
        f"node m is not an edge node (label {EDGE_ROLE_LABEL})",
    )
    nothing = resolve(Targets(node_names=("Bad",)), namespace="ns")
    assert nothing.empty_reason == "no target node: 'Bad' is not a node name"


def test_made_up_node_names_get_no_task_and_a_short_reason() -> None:
    """150 made-up names next to one real node: one target; the reason names the first ten and counts the rest."""
    made_up = tuple(f"made-up-{i:03d}" for i in range(150))
    found = resolve(Targets(node_names=("real", *made_up)), namespace="ns", nodes=[node("real")])
    assert found.nodes == ("real",)
    assert len(found.skipped) == 150
    said = listed(found.skipped)
    assert said.startswith("node made-up-000 does not exist; node made-up-001 does not exist")
    assert said.endswith("; and 140 more")
    assert len(said) < 1000


@given(
    st.lists(st.sampled_from([f"n{i}" for i in range(12)]), max_size=20),
    st.dictionaries(st.sampled_from([f"n{i}" for i in range(12)]), st.booleans()),
)
def test_only_named_nodes_that_exist_and_are_edge_nodes_are_targets_and_every_other_name_is_said(
    names: list[str], existing: dict[str, bool]
) -> None:
    """Whatever the names and the Nodes that exist: the targets are exactly the named existing edge nodes, in
    order, and every other distinct name is left out with a reason."""
    nodes = [node(name, edge=edge) for name, edge in existing.items()]
    found = resolve(Targets(node_names=tuple(names)), namespace="ns", nodes=nodes)
    distinct = list(dict.fromkeys(names))
    assert list(found.nodes) == [n for n in distinct if existing.get(n) is True]
    assert len(found.nodes) + len(found.skipped) == len(distinct)
    assert bool(found.empty_reason) == (not found.nodes)


def test_more_targets_than_allowed_are_refused_whole() -> None:
    """A list longer than ``max_targets`` (duplicates counted once) is refused before anything is read, saying
    the setting; so is a selector that reaches more edge nodes than that."""
    names = tuple(f"n{i}" for i in range(4))
    assert requested(Targets(node_names=(*names, "n0"))) == 4
    too_many = resolve(Targets(node_names=names), namespace="ns", nodes=[node(n) for n in names], max_targets=3)
    assert (too_many.nodes, too_many.too_many) == ((), True)
    assert too_many.empty_reason == (
        "it lists 4 node names, more than the 3 a Diagnosis may have (the controller's diagnosisMaxTargets)"
    )
    exactly = resolve(Targets(node_names=names), namespace="ns", nodes=[node(n) for n in names], max_targets=4)
    assert (exactly.nodes, exactly.too_many) == (names, False)
    selector = Targets(node_selector=LabelSelector(match_labels={"zone": "a"}))
    matched = [node(n, zone="a") for n in names]
    assert resolve(selector, namespace="ns", nodes=matched, max_targets=3).too_many
    refs = tuple(PodReference(namespace="ns", name=f"p{i}") for i in range(4))
    assert resolve(Targets(pod_references=refs), namespace="ns", max_targets=3).empty_reason.startswith(
        "it lists 4 pod references"
    )


def test_a_pod_selector_selects_pods_of_the_diagnosis_namespace_and_their_nodes() -> None:
    """Matching pods of the Diagnosis's namespace only; each node once, carrying its first pod by name;
    a pod not yet on a node, or on a node that is not an edge node, is left out and said."""
    selector = LabelSelector(match_labels={"app": "web"})
    pods = [
        pod("ns", "web-1", "e1", app="web"),
        pod("ns", "web-0", "e1", app="web"),
        pod("ns", "web-2", "e2", app="web"),
        pod("ns", "web-3", "", app="web"),
        pod("ns", "web-4", "m1", app="web"),
        pod("other", "web-9", "e9", app="web"),
        pod("ns", "db-0", "e3", app="db"),
    ]
    nodes = [node("e1"), node("e2"), node("e3"), node("e9"), node("m1", edge=False)]
    found = resolve(Targets(pod_selector=selector), namespace="ns", pods=pods, nodes=nodes)
    assert found.nodes == ("e1", "e2")
    assert dict(found.pods) == {
        "e1": PodReference(namespace="ns", name="web-0"),
        "e2": PodReference(namespace="ns", name="web-2"),
    }
    assert found.skipped == (
        "pod ns/web-3 is not on a node yet",
        f"pod ns/web-4 is on a node that gets no Task: node m1 is not an edge node (label {EDGE_ROLE_LABEL})",
    )


def test_a_pod_selector_matching_nothing_fails_instead_of_selecting_nothing_silently() -> None:
    """KubeDiag builds the pod selector from the node selector; here it matches pods, and none is a reason."""
    found = resolve(Targets(pod_selector=LabelSelector(match_labels={"app": "web"})), namespace="ns")
    assert found.empty_reason == "no target node: the pod selector 'app=web' matched no pod in namespace ns"


def test_pod_references_lead_to_their_nodes_with_their_containers() -> None:
    """Each referenced pod's node, in reference order, carrying the reference (its container too);
    a pod that does not exist is named."""
    refs = (
        PodReference(namespace="ns", name="p", container="c"),
        PodReference(namespace="ns", name="gone"),
        PodReference(namespace="ns", name="q"),
    )
    pods = [pod("ns", "q", "e2"), pod("ns", "p", "e1")]
    found = resolve(Targets(pod_references=refs), namespace="ns", pods=pods, nodes=[node("e1"), node("e2")])
    assert found.nodes == ("e1", "e2")
    assert found.pods["e1"] == refs[0]
    assert found.skipped == ("pod ns/gone does not exist",)
    nothing = resolve(Targets(pod_references=refs[1:2]), namespace="ns")
    assert nothing.empty_reason == "no target node: pod ns/gone does not exist"


def test_pod_references_to_another_namespace_are_never_read_and_lead_nowhere() -> None:
    """A reference to a pod of another namespace is not among those the controller reads, and even if that pod
    were listed it gives no node: the reason is the same whether the pod exists or not."""
    refs = (PodReference(namespace="kube-system", name="secret-pod"), PodReference(namespace="ns", name="p"))
    assert readable(Targets(pod_references=refs), namespace="ns") == (refs[1],)
    there = [pod("kube-system", "secret-pod", "e9"), pod("ns", "p", "e1")]
    nodes = [node("e1"), node("e9")]
    found = resolve(Targets(pod_references=refs), namespace="ns", pods=there, nodes=nodes)
    assert found.nodes == ("e1",)
    assert found.skipped == ("pod kube-system/secret-pod is not in the Diagnosis's namespace ns",)
    alone = Targets(pod_references=refs[:1])
    absent = resolve(alone, namespace="ns", nodes=nodes)
    present = resolve(alone, namespace="ns", pods=there, nodes=nodes)
    assert absent == present
    assert present.empty_reason == "no target node: pod kube-system/secret-pod is not in the Diagnosis's namespace ns"
