"""A clock's RFC 3339 stamp says the same second as formatting its datetime does."""

from __future__ import annotations

from datetime import UTC, datetime

import trio
import trio.testing
from hypothesis import assume, given
from hypothesis import strategies as st

from nodetask.clock import Clock, format_time, parse_time


@given(
    base=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)),
    elapsed=st.floats(min_value=0, max_value=10 * 365 * 86400, allow_nan=False),
)
def test_a_stamp_names_the_second_its_datetime_formats_to(base: datetime, elapsed: float) -> None:
    """For any anchor and loop time (off the edge of a second, where rounding differs) stamp() is format_time(now())."""
    fraction = (base.microsecond / 1e6 + elapsed) % 1
    assume(0.001 < fraction < 0.999)
    clock = Clock(base=base)
    mock = trio.testing.MockClock()
    mock.jump(elapsed)

    async def read() -> tuple[str, datetime]:
        return clock.stamp(), clock.now()

    stamp, now = trio.run(read, clock=mock)
    assert stamp == format_time(now)
    assert parse_time(stamp) == now.replace(microsecond=0)
