"""Fixtures of the edge's unit tests."""

from __future__ import annotations

import pytest
from trio.testing import MockClock


@pytest.fixture
def clock() -> MockClock:
    """Virtual time, jumping to the next deadline once all tasks (and the store's thread) sat idle for 5 ms.

    The store's calls run in worker threads, which trio's autojump cannot see: with every task waiting
    on one, the clock would jump to the next deadline at once. So it jumps only after everything has
    been idle for a few milliseconds of real time.
    """
    return MockClock(autojump_threshold=0.005)
