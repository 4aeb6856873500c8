"""A queue of jobs each due at a moment of the event loop's clock, taken by a pool of workers."""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Generic, TypeVar

import anyio

__all__ = ["DelayQueue"]

J = TypeVar("J")


class DelayQueue(Generic[J]):
    """Jobs in the order they fall due (then the order they were put); :meth:`get` waits for the next."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, J]] = []
        self._order = itertools.count()
        self._changed = anyio.Event()

    def __len__(self) -> int:
        return len(self._heap)

    def put(self, job: J, delay: float = 0.0) -> None:
        """Add ``job``, due ``delay`` seconds from now."""
        heapq.heappush(self._heap, (anyio.current_time() + delay, next(self._order), job))
        self._changed.set()

    async def get(self) -> J:
        """The next job once it is due."""
        while True:
            if self._heap and self._heap[0][0] <= anyio.current_time():
                return heapq.heappop(self._heap)[2]
            if self._changed.is_set():
                self._changed = anyio.Event()
            changed = self._changed
            wait = self._heap[0][0] - anyio.current_time() if self._heap else math.inf
            with anyio.move_on_after(wait):
                await changed.wait()
