"""A node's binding reaches its Pods at most once per interval, and the value it has last is the one applied."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.autonomy.binding_pace import Pace, paced
from flows.autonomy.toleration_binding import Binding
from roles.common.config import ControllerConfig

INTERVAL = 10.0
BINDINGS = st.sampled_from([None, Binding(None), Binding(1), Binding(2), Binding(300)])
SEEN = st.lists(st.tuples(st.integers(min_value=0, max_value=25), BINDINGS), min_size=1, max_size=60)
"""What the controller sees of one node: after each pause (whole seconds, so that sums are exact and an
interval to the second is hit often), the binding its Node asks for."""


@dataclass
class Node:
    """The controller's side of one node's pace: it decides on each sight, and looks again when told."""

    pace: Pace | None = None
    wanted: Binding | None = None
    again: float | None = None
    changes: list[tuple[float, Binding | None]] = field(default_factory=list)
    """Each change of the applied binding (the first sight included), at its loop time."""

    def see(self, now: float) -> None:
        before = self.pace
        self.pace, self.again = paced(before, self.wanted, now=now, interval=INTERVAL)
        if before is None or self.pace.applied != before.applied:
            self.changes.append((now, self.pace.applied))

    def run_until(self, now: float) -> None:
        """Looks again, as a timer would, at each time asked for up to ``now``."""
        while self.again is not None and self.again <= now:
            self.see(self.again)


def played(seen: list[tuple[int, Binding | None]]) -> tuple[Node, float]:
    """The node after ``seen`` and every look asked for after it; and the time of the last sight."""
    node, now = Node(), 0.0
    for pause, wanted in seen:
        now += pause
        node.run_until(now)
        node.wanted = wanted
        node.see(now)
    last = now
    node.run_until(float("inf"))
    return node, last


@given(SEEN)
def test_the_applied_binding_changes_at_most_once_per_interval(seen: list[tuple[int, Binding | None]]) -> None:
    """However fast the Node's binding flaps, two changes of the one its Pods are held to are an interval apart:
    over a time T there are at most 1 + T / interval of them, so at most that many patches of each bound Pod."""
    node, _ = played(seen)
    times = [at for at, _ in node.changes]
    assert all(later - earlier >= INTERVAL for earlier, later in itertools.pairwise(times))
    assert len(times) <= 1 + (times[-1] - times[0]) / INTERVAL


@given(SEEN)
def test_the_value_the_node_has_last_is_applied_within_an_interval(seen: list[tuple[int, Binding | None]]) -> None:
    """Coalesced, not lost: once the flapping stops, the last value seen is the one applied, at most an interval
    after it was seen, and then nothing is held back."""
    node, last = played(seen)
    assert node.pace is not None
    assert node.pace.applied == seen[-1][1]
    assert node.changes[-1][0] <= last + INTERVAL
    assert node.again is None


@given(SEEN)
def test_a_change_is_applied_at_once_when_the_last_one_is_an_interval_old(
    seen: list[tuple[int, Binding | None]],
) -> None:
    """Holding back is only for changes that come too soon: on a node whose binding last changed an interval ago
    or more, or seen for the first time, a new binding is applied when seen."""
    node, now = Node(), 0.0
    for pause, wanted in seen:
        now += pause
        node.run_until(now)
        node.wanted = wanted
        quiet = node.pace is None or now >= node.pace.since + INTERVAL
        node.see(now)
        if quiet:
            assert node.pace is not None
            assert node.pace.applied == wanted
            assert node.again is None


def test_values_that_come_and_go_within_an_interval_are_never_applied() -> None:
    """300 flaps between 1 s and 2 s inside one interval, ending on 45 s: the Pods go from 90 s to 45 s once."""
    node, now = Node(wanted=Binding(90)), 0.0
    node.see(now)
    for i in range(300):
        now += 0.01
        node.wanted = Binding(1 + i % 2)
        node.see(now)
    node.wanted = Binding(45)
    node.see(now)
    node.run_until(float("inf"))
    assert node.changes == [(0.0, Binding(90)), (INTERVAL, Binding(45))]


def test_a_change_back_before_the_interval_is_over_holds_nothing() -> None:
    """A binding changed and changed back within the interval leaves the applied one as it was, nothing held."""
    pace, again = paced(None, Binding(30), now=0.0, interval=INTERVAL)
    held, again = paced(pace, Binding(1), now=1.0, interval=INTERVAL)
    assert (held, again) == (pace, INTERVAL)
    assert paced(held, Binding(30), now=2.0, interval=INTERVAL) == (pace, None)


def test_the_interval_is_a_minute_unless_set_and_must_be_positive() -> None:
    """``autonomyBindingInterval`` defaults to 60 s; zero (no pacing at all) is refused, naming the setting."""
    assert ControllerConfig().autonomy_binding_interval == 60.0
    assert msgspec.convert({"autonomyBindingInterval": 5}, ControllerConfig).autonomy_binding_interval == 5.0
    with pytest.raises(msgspec.ValidationError, match=r"\$\.autonomyBindingInterval"):
        msgspec.convert({"autonomyBindingInterval": 0}, ControllerConfig)
