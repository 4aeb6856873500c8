"""A Diagnosis's targets resolve to nodes once: every selector works, and what leads nowhere is said."""

from __future__ import annotations

from flows.diagnosis_targets import resolve
from schemas.core import Node, Pod, PodSpec
from schemas.diagnosis import PodReference, Targets
from schemas.meta import LabelSelector, ObjectMeta


def node(name: str, **labels: str) -> Node:
    return Node(metadata=ObjectMeta(name=name, labels=labels))


def pod(namespace: str, name: str, on: str = "", **labels: str) -> Pod:
    return Pod(metadata=ObjectMeta(name=name, namespace=namespace, labels=labels), spec=PodSpec(node_name=on))


def test_a_node_selector_selects_matching_nodes_in_name_order() -> None:
    """Nodes whose labels match, sorted; extra nodes the list returned change nothing."""
    selector = LabelSelector(match_labels={"zone": "a"})
    nodes = [node("e2", zone="a"), node("e1", zone="a"), node("c1", zone="b")]
    assert resolve(Targets(node_selector=selector), namespace="ns", nodes=nodes).nodes == ("e1", "e2")


def test_a_node_selector_matching_nothing_says_so() -> None:
    """No node matched: no targets, and the reason quotes the selector."""
    found = resolve(Targets(node_selector=LabelSelector(match_labels={"zone": "x"})), namespace="ns")
    assert found.nodes == ()
    assert found.empty_reason == "the node selector 'zone=x' matched no node"


def test_node_names_are_taken_once_each_in_order_but_not_impossible_ones() -> None:
    """Duplicates count once; a name no node can have is left out and said."""
    found = resolve(Targets(node_names=("b", "a", "b", "Not_A_Node")), namespace="ns")
    assert found.nodes == ("b", "a")
    assert found.skipped == ("'Not_A_Node' is not a node name",)
    nothing = resolve(Targets(node_names=("Bad",)), namespace="ns")
    assert nothing.empty_reason == "no target node: 'Bad' is not a node name"


def test_a_pod_selector_selects_pods_of_the_diagnosis_namespace_and_their_nodes() -> None:
    """Matching pods of the Diagnosis's namespace only; each node once, carrying its first pod by name;
    a pod not yet on a node is left out and said."""
    selector = LabelSelector(match_labels={"app": "web"})
    pods = [
        pod("ns", "web-1", "e1", app="web"),
        pod("ns", "web-0", "e1", app="web"),
        pod("ns", "web-2", "e2", app="web"),
        pod("ns", "web-3", "", app="web"),
        pod("other", "web-9", "e9", app="web"),
        pod("ns", "db-0", "e3", app="db"),
    ]
    found = resolve(Targets(pod_selector=selector), namespace="ns", pods=pods)
    assert found.nodes == ("e1", "e2")
    assert dict(found.pods) == {
        "e1": PodReference(namespace="ns", name="web-0"),
        "e2": PodReference(namespace="ns", name="web-2"),
    }
    assert found.skipped == ("pod ns/web-3 is not on a node yet",)


def test_a_pod_selector_matching_nothing_fails_instead_of_selecting_nothing_silently() -> None:
    """KubeDiag builds the pod selector from the node selector; here it matches pods, and none is a reason."""
    found = resolve(Targets(pod_selector=LabelSelector(match_labels={"app": "web"})), namespace="ns")
    assert found.empty_reason == "no target node: the pod selector 'app=web' matched no pod in namespace ns"


def test_pod_references_lead_to_their_nodes_with_their_containers() -> None:
    """Each referenced pod's node, in reference order, carrying the reference (its container too);
    a pod that does not exist is named."""
    refs = (
        PodReference(namespace="a", name="p", container="c"),
        PodReference(namespace="b", name="gone"),
        PodReference(namespace="b", name="q"),
    )
    found = resolve(Targets(pod_references=refs), namespace="ns", pods=[pod("b", "q", "e2"), pod("a", "p", "e1")])
    assert found.nodes == ("e1", "e2")
    assert found.pods["e1"] == refs[0]
    assert found.skipped == ("pod b/gone does not exist",)
    nothing = resolve(Targets(pod_references=refs[1:2]), namespace="ns")
    assert nothing.empty_reason == "no target node: pod b/gone does not exist"
