"""Benchmark waits: each has a deadline, and one that runs out names what it waited for and how far it got."""

from __future__ import annotations

import anyio
import pytest
import trio.testing

from bench.waits import Stalled, deadline, until_count


async def test_a_count_that_stops_short_fails_naming_what_and_how_far(autojump_clock: trio.testing.MockClock) -> None:
    """A count stuck at 733 of 1000 fails at its deadline saying so, and since when it has not moved."""
    marked = 0

    async def count() -> float:
        nonlocal marked
        marked = min(marked + 100, 733)
        return marked

    with pytest.raises(Stalled) as stalled:
        await until_count("Nodes marked", count, 1000, limit_s=300, interval_s=1.0)
    assert str(stalled.value) == "waited 300 s for Nodes marked: 733 of 1000 (the count last moved 293 s ago)"
    assert anyio.current_time() == pytest.approx(300)


async def test_a_count_that_arrives_returns_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """Reaching the target ends the wait with the count, long before the deadline."""
    done = 0

    async def count() -> float:
        nonlocal done
        done += 250
        return done

    assert await until_count("sessions welcomed", count, 1000, limit_s=300, interval_s=1.0) == 1000
    assert anyio.current_time() == pytest.approx(3)


async def test_a_block_past_its_deadline_fails_naming_it(autojump_clock: trio.testing.MockClock) -> None:
    """A block that outlives its deadline is cut there with Stalled naming what it waited for."""
    with pytest.raises(Stalled, match=r"^waited 60 s for the agent's Hello$"), deadline("the agent's Hello", 60):
        await anyio.sleep_forever()
