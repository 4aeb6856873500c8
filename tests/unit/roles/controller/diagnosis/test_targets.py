"""Reading a Diagnosis's node targets: what the watch has not shown costs a read each when few, one list when many."""

from __future__ import annotations

from typing import Any

from roles.controller.diagnosis.targets import FEW_UNSEEN, read_targets
from roles.kube import NotFound
from roles.kube.resources import NODE_HEADS, NODES
from schemas.core import EDGE_ROLE_LABEL, Node
from schemas.diagnosis.v1 import Diagnosis, DiagnosisSpec, TargetSelector
from schemas.meta import ObjectMeta


def _node(name: str, *, edge: bool = True) -> Node:
    return Node(metadata=ObjectMeta(name=name, labels={EDGE_ROLE_LABEL: ""} if edge else {}))


class CountingApi:
    """The Nodes of an API server, counting the reads of them by kind of read."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = {n.metadata.name: n for n in nodes}
        self.gets = 0
        self.lists = 0

    async def get(self, resource: Any, name: str, *, namespace: str = "") -> Node:
        assert resource is NODES
        self.gets += 1
        if name not in self.nodes:
            raise NotFound(404, "NotFound", f'nodes "{name}" not found')
        return self.nodes[name]

    async def list(self, resource: Any, **_: Any) -> tuple[list[Node], list[Any], str]:
        assert resource is NODE_HEADS
        self.lists += 1
        return list(self.nodes.values()), [], "7"


def _diagnosis(names: list[str]) -> Diagnosis:
    spec = DiagnosisSpec(operation_set="set", target_selector=TargetSelector(node_names=tuple(names)))
    return Diagnosis(metadata=ObjectMeta(name="d", namespace="default"), spec=spec)


async def test_hundreds_of_made_up_names_cost_one_list_and_a_node_the_watch_missed_is_still_found() -> None:
    """300 made-up names beside a Node the watch has shown and one it has not: one list, no read each."""
    api = CountingApi([_node("seen"), _node("new"), _node("cloud", edge=False)])
    made_up = [f"made-up-{i:03d}" for i in range(300)]
    resolution = await read_targets(
        api,  # type: ignore[arg-type]
        _diagnosis(["seen", "new", "cloud", *made_up]),
        nodes={"seen": _node("seen")},
        max_targets=5000,
    )
    assert (api.gets, api.lists) == (0, 1)
    assert resolution.nodes == ("seen", "new")
    assert any("cloud" in reason and EDGE_ROLE_LABEL in reason for reason in resolution.skipped)
    assert any("made-up-000 does not exist" in reason for reason in resolution.skipped)


async def test_a_few_names_the_watch_has_not_shown_are_read_one_by_one() -> None:
    """Up to FEW_UNSEEN unseen names cost a read each and no list."""
    api = CountingApi([_node("new")])
    names = ["new", *(f"made-up-{i}" for i in range(FEW_UNSEEN - 1))]
    resolution = await read_targets(api, _diagnosis(names), nodes={}, max_targets=5000)  # type: ignore[arg-type]
    assert (api.gets, api.lists) == (FEW_UNSEEN, 0)
    assert resolution.nodes == ("new",)
