"""The device's judgement of a restarted kubelet, from the Node it posts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from flows.nodejobs.kubelet_health import node_problem
from schemas.core import Node, NodeCondition, NodeStatus, NodeSystemInfo

RESTARTED = datetime(2026, 11, 29, 7, 0, 0, 4_000, tzinfo=UTC)
"""A restart begins just after a whole second."""


def _node(version: str = "v1.20.3", ready: str = "True", beat: str | None = "2026-11-29T07:00:01Z") -> Node:
    condition = NodeCondition(type="Ready", status=ready, reason="KubeletReady", last_heartbeat_time=beat)
    return Node(status=NodeStatus(conditions=(condition,), node_info=NodeSystemInfo(kubelet_version=version)))


@pytest.mark.parametrize("beat", ["2026-11-29T07:00:00Z", "2026-11-29T07:00:01Z"])
def test_a_ready_node_at_the_version_posted_in_the_restarts_second_or_later_is_healthy(beat: str) -> None:
    """A heartbeat in the restart's second (a quick kubelet's only post for minutes) or later is the new kubelet's."""
    assert node_problem(_node(beat=beat), version="v1.20.3", since=RESTARTED) == ""


@pytest.mark.parametrize(
    ("node", "problem"),
    [
        (None, "the device holds no Node object of its own"),
        (_node(version="v1.20.2"), "the Node reports kubelet version v1.20.2, not v1.20.3"),
        (Node(), "the Node reports kubelet version (none), not v1.20.3"),
        (_node(ready="False"), "the Node is not Ready (KubeletReady)"),
        (_node(beat=None), "the Node's Ready condition has no heartbeat time"),
        (_node(beat="2026-11-29T06:59:59Z"), "the kubelet has not posted its Node's status since it was restarted"),
    ],
)
def test_each_way_a_kubelet_is_not_back_yet_is_named(node: Node | None, problem: str) -> None:
    """Missing Node, another version, not Ready, no heartbeat, or a heartbeat from a second before the restart."""
    assert node_problem(node, version="v1.20.3", since=RESTARTED) == problem
