"""The Node marks a hub has under way, and how long the oldest has waited.

A mark waits for a slot among the API client's requests and then for its answer. In a connect storm
thousands wait at once, which is fine while they drain; a mark that waits far longer than that means
the hub's writes are stuck, while its sessions and heartbeats look healthy. The hub's metrics and
readiness read this book to say so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class PendingMarks:
    """Marks under way, each with the time it began (``now`` is the event loop's clock)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._since: dict[int, float] = {}
        self._ids = itertools.count()

    @contextmanager
    def pending(self) -> Iterator[None]:
        """Count one mark as pending for the duration of the block."""
        key = next(self._ids)
        self._since[key] = self._now()
        try:
            yield
        finally:
            del self._since[key]

    def __len__(self) -> int:
        return len(self._since)

    def oldest_age(self) -> float:
        """Seconds the oldest pending mark has waited; 0 when none is pending."""
        # Insertion order is start order, and a dict keeps it across deletions.
        first = next(iter(self._since.values()), None)
        return 0.0 if first is None else self._now() - first
