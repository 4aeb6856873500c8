"""Capped exponential backoff with jitter, for every retry loop (API calls, reconnects, restarts)."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """Capped exponential backoff with "equal" jitter.

    The ceiling starts at ``initial`` and doubles with each :meth:`delay` up to ``cap``; each delay
    is drawn uniformly from the upper half of it, ``[ceiling / 2, ceiling]``, so retries of many
    clients spread out while none retries sooner than half the ceiling. :meth:`reset` starts over.
    """

    initial: float = 0.5
    cap: float = 30.0
    _next: float = 0.0

    def reset(self) -> None:
        self._next = 0.0

    def delay(self) -> float:
        self._next = min(self.cap, max(self.initial, self._next * 2))
        return random.uniform(self._next / 2, self._next)
