"""A token bucket as a value: how much of a rate a peer may spend at once, and what it has left. Pure.

A hub keeps one per node for what its edge can make it spend on demand (its ``CacheFetch`` keys):
up to ``burst`` at once, then ``rate`` a second. The bucket is refilled lazily from the loop time of
its last take, so that an idle edge costs no timer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["TokenBucket", "level", "take"]


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """``tokens`` left as of loop time ``at``; it refills at ``rate`` a second up to ``burst``."""

    rate: float
    burst: float
    tokens: float
    at: float

    @classmethod
    def full(cls, *, rate: float, burst: float, now: float) -> TokenBucket:
        """A bucket holding ``burst`` tokens at ``now``."""
        return cls(rate=rate, burst=burst, tokens=burst, at=now)


def level(bucket: TokenBucket, now: float) -> float:
    """The tokens ``bucket`` holds at ``now``."""
    return min(bucket.burst, bucket.tokens + max(0.0, now - bucket.at) * bucket.rate)


def take(bucket: TokenBucket, cost: float, now: float) -> TokenBucket | None:
    """``bucket`` after ``cost`` tokens are taken at ``now``; None when it holds fewer (then nothing is taken)."""
    tokens = level(bucket, now)
    if tokens < cost:
        return None
    return replace(bucket, tokens=tokens - cost, at=now)
