"""The watch backoff grows exponentially to its cap, with jitter, and resets after success."""

from __future__ import annotations

from nodetask.backoff import Backoff


def test_backoff_grows_to_its_cap_with_jitter_and_resets() -> None:
    """Each delay lies in the upper half of a doubling window capped at `cap`; reset starts over."""
    backoff = Backoff(initial=0.5, cap=8.0)
    windows = [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for window in windows:
        delay = backoff.delay()
        assert window / 2 <= delay <= window
    backoff.reset()
    assert 0.25 <= backoff.delay() <= 0.5
