"""A hub's connection caps stay below its file limit, places are never over-given, peer-caused logs are throttled."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from roles.cloud.transport.ingress import RESERVE_MIN, Admission, LogThrottle, connection_limits
from roles.common.slots import Slots


@given(st.integers(min_value=RESERVE_MIN + 64, max_value=1 << 22))
def test_default_caps_leave_a_reserve_below_the_file_limit(nofile: int) -> None:
    """Handshakes, sessions and HTTP connections together leave at least a tenth (and 256) of the descriptors free."""
    limits = connection_limits(nofile)
    reserve = max(RESERVE_MIN, nofile // 10)
    assert limits.handshakes + limits.sessions == nofile - reserve
    assert limits.http <= reserve // 4 or limits.http == 16
    assert limits.handshakes + limits.sessions + limits.http < nofile
    # An unauthenticated flood can hold at most a quarter of the places edges connect through.
    assert limits.handshakes <= limits.sessions


def test_caps_for_common_limits() -> None:
    """The usual soft limits give these caps (the numbers the documentation quotes)."""
    assert (connection_limits(1024).handshakes, connection_limits(1024).sessions) == (192, 576)
    assert (connection_limits(20000).handshakes, connection_limits(20000).sessions) == (4500, 13500)
    assert connection_limits(20000).http == 256


@given(st.integers(min_value=1, max_value=RESERVE_MIN + 64))
def test_a_tiny_file_limit_still_admits_someone(nofile: int) -> None:
    """Even below the reserve there is one place of each kind (the hub then logs its caps at start)."""
    limits = connection_limits(nofile)
    assert limits.handshakes >= 1
    assert limits.sessions >= 1


@given(st.lists(st.sampled_from(["connect", "auth", "leave"]), max_size=60))
def test_places_in_use_never_exceed_their_caps_and_all_come_back(steps: list[str]) -> None:
    """Whatever connections do, places in use stay within the caps and every one is given back on leaving."""
    handshakes, sessions = Slots(3), Slots(2)
    open_: list[Admission] = []
    authed: set[int] = set()
    for step in steps:
        if step == "connect":
            admission = Admission(handshakes=handshakes, sessions=sessions)
            if admission.enter():
                open_.append(admission)
        elif step == "auth" and len(authed) < len(open_):
            index = next(i for i in range(len(open_)) if i not in authed)
            authed.add(index)
            open_[index].promote()
        elif step == "leave" and open_:
            open_[0].leave()
            open_[0].leave()  # idempotent
            open_.pop(0)
            authed = {i - 1 for i in authed if i > 0}
        assert 0 <= handshakes.used <= handshakes.total
        assert 0 <= sessions.used <= sessions.total
    for admission in open_:
        admission.leave()
    assert (handshakes.used, sessions.used) == (0, 0)


def test_an_authenticated_edge_trades_its_handshake_place_for_a_session_place() -> None:
    """Promotion frees the handshake place even when no session place is left."""
    handshakes, sessions = Slots(1), Slots(1)
    first, second, third = (Admission(handshakes=handshakes, sessions=sessions) for _ in range(3))
    assert first.enter()
    assert not second.enter()  # the only handshake place is taken
    assert first.promote()
    assert second.enter()
    assert not second.promote()  # the only session place is taken
    assert (handshakes.used, sessions.used) == (0, 1)
    assert third.enter()
    first.leave()
    assert third.promote()


def test_giving_back_a_place_never_taken_is_a_bug() -> None:
    """Slots refuse to go below zero rather than silently raising the cap."""
    with pytest.raises(AssertionError):
        Slots(1).give()


async def test_waiting_for_a_place_returns_once_one_is_given_back(autojump_clock: trio.testing.MockClock) -> None:
    """wait_free blocks while every place is taken and returns when one is given back, without taking it."""
    slots = Slots(1)
    assert slots.take()
    freed_at: list[float] = []

    async def waiter() -> None:
        await slots.wait_free()
        freed_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(5)
        assert freed_at == []
        slots.give()
    assert freed_at == [5]
    assert (slots.used, slots.take()) == (0, True)  # the place is free for whoever comes next


def test_throttle_lets_a_burst_through_then_says_how_many_it_left_out() -> None:
    """Ten lines a second per event; the first line of the next second counts the ones left out."""
    throttle = LogThrottle(burst=10, period=1.0)
    shown = [throttle.allow("frame_rejected", 0.01 * i) for i in range(25)]
    assert shown[:10] == [0] * 10
    assert shown[10:] == [None] * 15
    assert throttle.allow("edge_error", 0.3) == 0  # other events have their own budget
    assert throttle.allow("frame_rejected", 1.0) == 15
    assert throttle.allow("frame_rejected", 1.1) == 0


def test_a_hub_raises_its_soft_file_limit_to_the_hard_one() -> None:
    """A hub started under a low soft RLIMIT_NOFILE takes what the hard limit allows, so its caps follow."""
    script = (
        "import resource\n"
        "from roles.cloud.transport.ingress import fd_limit, raise_fd_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "before, after = raise_fd_limit()\n"
        "print(before, after, fd_limit(), hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    before, after, limit, hard = (int(v) for v in out.split())
    assert before == min(256, hard)
    assert after == limit == hard
