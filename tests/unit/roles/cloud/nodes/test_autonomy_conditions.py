"""The Autonomy condition an edge reports, written on its Node by the hub only when it changes, with Events."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest
import trio.testing

from nodetask.messages import CACHE_CAPABILITY, AutonomyCondition, Error
from roles.cloud.nodes.autonomy_conditions import with_autonomy
from roles.kube.resources import NODES
from schemas.core import Node, NodeCondition, NodeStatus
from schemas.meta import ObjectMeta
from tests.unit.roles.cloud.cache_world import until
from tests.unit.roles.cloud.doubles import FakeEdge, MemoryApi, running_hub
from tests.unit.roles.cloud.nodes.doubles import RacingKubelet

READY = NodeCondition(type="Ready", status="True", reason="KubeletReady", last_transition_time="2026-01-01T00:00:00Z")
ENABLED = AutonomyCondition(status="True", reason="autonomy enabled successfully", message="works")


def _autonomy(node: Node) -> NodeCondition | None:
    return next((c for c in node.status.conditions if c.type == "Autonomy"), None)


def test_the_condition_is_added_with_both_times_when_the_node_has_none() -> None:
    """A first Autonomy condition comes after the others, transitioned and heard from now."""
    merged = with_autonomy((READY,), status="True", reason="r", message="m", now="T1")
    assert merged == (
        READY,
        NodeCondition(
            type="Autonomy", status="True", reason="r", message="m", last_heartbeat_time="T1", last_transition_time="T1"
        ),
    )


def test_nothing_is_written_when_status_reason_and_message_are_the_same() -> None:
    """The same condition again is no change, whatever the time."""
    first = with_autonomy((READY,), status="True", reason="r", message="m", now="T1")
    assert first is not None
    assert with_autonomy(first, status="True", reason="r", message="m", now="T2") is None


@pytest.mark.parametrize(
    ("status", "message", "transition"), [("True", "other", "T1"), ("Unknown", "m", "T2"), ("False", "m", "T2")]
)
def test_the_transition_time_stays_while_the_status_does(status: str, message: str, transition: str) -> None:
    """A new message keeps lastTransitionTime; a new status sets it; the heartbeat time is the write's."""
    first = with_autonomy((READY,), status="True", reason="r", message="m", now="T1")
    assert first is not None
    merged = with_autonomy(first, status=status, reason="r", message=message, now="T2")
    assert merged is not None
    assert merged[0] == READY
    assert (merged[1].status, merged[1].message) == (status, message)
    assert (merged[1].last_transition_time, merged[1].last_heartbeat_time) == (transition, "T2")


async def _edge(door: Any, node: str = "n0") -> FakeEdge:
    edge: FakeEdge = door.connect(node)
    await edge.hello(capabilities=(CACHE_CAPABILITY,))
    return edge


def _status_patches(api: MemoryApi) -> int:
    return sum(1 for plural, _, sub in api.patches if plural == "nodes" and sub == "status")


async def test_the_hub_writes_the_condition_only_when_it_changes_with_an_event_per_status_change(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """True is written with an Event; the same again writes nothing; a new message keeps the transition time
    without an Event; Unknown is a transition with a Warning Event; the Node's other conditions stay."""
    api = MemoryApi()
    api.put(NODES, Node(metadata=ObjectMeta(name="n0"), status=NodeStatus(conditions=(READY,))))
    async with running_hub(api) as (_, door):
        edge = await _edge(door)
        await edge.send(ENABLED)
        await until(lambda: _autonomy(api.peek(NODES, "n0")) is not None)
        first = _autonomy(api.peek(NODES, "n0"))
        assert first is not None
        assert (first.status, first.message) == ("True", "works")
        await edge.send(ENABLED)
        await anyio.sleep(5)
        assert _status_patches(api) == 1
        await anyio.sleep(20)  # so that the next write has another time
        await edge.send(AutonomyCondition(status="True", reason=ENABLED.reason, message="still works"))
        await until(lambda: _status_patches(api) == 2)
        second = _autonomy(api.peek(NODES, "n0"))
        assert second is not None
        assert second.message == "still works"
        assert second.last_transition_time == first.last_transition_time
        assert second.last_heartbeat_time != first.last_heartbeat_time
        await edge.send(AutonomyCondition(status="Unknown", reason="cache failed", message="k: disk full"))
        await until(lambda: _status_patches(api) == 3)
        third = _autonomy(api.peek(NODES, "n0"))
        assert third is not None
        assert third.last_transition_time != first.last_transition_time
        await until(lambda: len(api.events) == 2)
    node = api.peek(NODES, "n0")
    assert node.status.conditions[0] == READY
    assert [(e.reason, e.type) for e in api.events] == [("AutonomyEnabled", "Normal"), ("AutonomyUnknown", "Warning")]
    event = api.events[1]
    assert (event.involved_object.kind, event.involved_object.name, event.involved_object.uid) == ("Node", "n0", "n0")
    assert event.metadata.namespace == "default"
    assert event.message == "Autonomy condition is Unknown: cache failed: k: disk full"


async def test_a_conflicting_status_write_is_read_again_and_keeps_the_other_writers_change(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The kubelet's write between the hub's read and its patch makes a conflict: the hub reads again, both stay."""
    api = RacingKubelet()
    api.put(NODES, Node(metadata=ObjectMeta(name="n0"), status=NodeStatus(conditions=(READY,))))
    async with running_hub(api) as (_, door):
        edge = await _edge(door)
        await edge.send(ENABLED)
        await until(lambda: _autonomy(api.peek(NODES, "n0")) is not None)
    conditions = api.peek(NODES, "n0").status.conditions
    assert [(c.type, c.status) for c in conditions] == [("Ready", "False"), ("Autonomy", "True")]


async def test_a_condition_with_a_status_kubernetes_does_not_know_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Status "Maybe" is answered with bad_condition and nothing is written."""
    api = MemoryApi()
    api.put(NODES, Node(metadata=ObjectMeta(name="n0")))
    async with running_hub(api) as (_, door):
        edge = await _edge(door)
        await edge.send(AutonomyCondition(status="Maybe", reason="r"))
        with anyio.fail_after(10):
            while not isinstance(error := await edge.receive(), Error):
                pass
    assert error.code == "bad_condition"
    assert _status_patches(api) == 0


async def test_a_flapping_edge_costs_a_bounded_number_of_node_writes_and_the_last_condition_wins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Ten conditions a second, True and Unknown in turn, for a minute: the Node is read and patched, and an
    Event recorded, at most once per autonomyConditionInterval (the hub's session mark aside), and the last
    condition sent is the one written."""
    api = MemoryApi()
    api.put(NODES, Node(metadata=ObjectMeta(name="n0"), status=NodeStatus(conditions=(READY,))))
    interval, seconds, per_second = 10.0, 60, 10
    async with running_hub(api, autonomy_condition_interval=interval) as (_, door):
        edge = await _edge(door)
        await anyio.sleep(1)  # the hub's mark on the Node (a read of its own) is done
        reads = api.reads["nodes"]
        async with anyio.create_task_group() as tg:
            tg.start_soon(edge.frames_within, math.inf)  # an edge reading its cache stream
            for i in range(seconds * per_second):
                unknown = AutonomyCondition(status="Unknown", reason="cache failed", message=f"flap {i}")
                await edge.send(ENABLED if i % 2 else unknown)
                await anyio.sleep(1 / per_second)
            last = AutonomyCondition(status="False", reason="autonomy disabled", message="the last word")
            await edge.send(last)
            await until(
                lambda: (c := _autonomy(api.peek(NODES, "n0"))) is not None and c.status == "False", 2 * interval
            )
            spent = (api.reads["nodes"] - reads, _status_patches(api), len(api.events))
            tg.cancel_scope.cancel()
    # One write at the first condition, then one per interval while they keep coming, and the last one's.
    writes = math.ceil((seconds + interval) / interval) + 1
    assert spent[0] <= writes
    assert spent[1] <= writes
    assert spent[2] <= writes
    condition = _autonomy(api.peek(NODES, "n0"))
    assert condition is not None
    assert (condition.status, condition.reason, condition.message) == ("False", "autonomy disabled", "the last word")
    assert api.events[-1].reason == "AutonomyDisabled"
