"""How many edge connections a hub takes at once, and how often it logs what they do wrong.

Every connection costs a file descriptor, and so does every request the hub makes to the API
server. 19,980 idle TCP connections once took all 20,000 of a hub's descriptors, after which its
own API calls failed. So the hub keeps a reserve for itself and splits the rest into two pools
that never borrow from each other: *handshakes* (from accept until the bearer token checked out)
and *sessions* (from then until the connection ends). A flood of unauthenticated connections can
then fill only the handshake pool, never take the place of an edge that holds a session, and the
excess is refused at accept, before any TLS or websocket work. While places turn over (a reconnect
storm: each handshake takes a millisecond or so) the accept loop waits for one instead, so the
edges queue in the kernel's backlog in arrival order rather than being sent away to retry.

Log lines caused by what a peer sends are throttled per event, so that a peer cannot grow the
hub's log faster than a few lines a second; the counters still count every one.
"""

from __future__ import annotations

import contextlib
import resource
from dataclasses import dataclass
from typing import Final, final

import anyio
import structlog

from roles.common.slots import Slots

__all__ = [
    "Admission",
    "ConnectionLimits",
    "LogThrottle",
    "connection_limits",
    "fd_limit",
    "raise_fd_limit",
    "warn_throttled",
]

RESERVE_MIN: Final = 256
"""Descriptors always kept for the hub's own use: the API client's pool (100), watches, the HTTP endpoint."""
UNLIMITED_FDS: Final = 1 << 20
"""What an RLIMIT_NOFILE of 'infinity' is taken as (Linux's default hard cap)."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Caps on the hub's inbound connections."""

    handshakes: int
    """Edge connections at once that have not yet presented a valid token."""
    sessions: int
    """Edge connections at once that have (until they end)."""
    http: int
    """Connections at once to the HTTP endpoint (health, metrics, KubeEdge's report endpoint)."""


def connection_limits(nofile: int) -> ConnectionLimits:
    """The default caps of a process allowed ``nofile`` open descriptors.

    A tenth of them (at least :data:`RESERVE_MIN`) stay with the hub; the HTTP endpoint may use a
    quarter of that reserve (16 to 256). Of the rest, a quarter may be handshakes and the others
    sessions, so the two caps and the reserve together stay below ``nofile``.
    """
    reserve = max(RESERVE_MIN, nofile // 10)
    budget = max(nofile - reserve, 2)
    handshakes = max(1, budget // 4)
    return ConnectionLimits(
        handshakes=handshakes,
        sessions=max(1, budget - handshakes),
        http=min(256, max(16, reserve // 4)),
    )


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns (before, after).

    Every edge session is a file descriptor, and the caps are derived from the soft limit: a hub
    left at a distribution's usual soft 1,024 would hold a few hundred edges however large its hard
    limit. Raising the soft limit up to the hard one needs no privilege.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):  # a limit the kernel refuses leaves things as they were
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fd_limit() -> int:
    """This process's soft RLIMIT_NOFILE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return UNLIMITED_FDS if soft == resource.RLIM_INFINITY else soft


@final
class Admission:
    """The place one edge connection holds: a handshake place from accept, then a session place."""

    def __init__(self, *, handshakes: Slots, sessions: Slots) -> None:
        self._handshakes = handshakes
        self._sessions = sessions
        self._held: Slots | None = None

    def enter(self) -> bool:
        """Take a handshake place for a connection just accepted; False: refuse it."""
        assert self._held is None
        if not self._handshakes.take():
            return False
        self._held = self._handshakes
        return True

    @property
    def holding(self) -> bool:
        """Whether a place is held (False once refused or left)."""
        return self._held is not None

    def promote(self) -> bool:
        """Trade the handshake place for a session place (the edge authenticated); False: none is free."""
        assert self._held is self._handshakes
        self.leave()
        if not self._sessions.take():
            return False
        self._held = self._sessions
        return True

    def leave(self) -> None:
        """Give back whatever place is held; idempotent."""
        if self._held is not None:
            self._held.give()
            self._held = None


@final
class LogThrottle:
    """At most ``burst`` lines per event every ``period`` seconds.

    Pure bookkeeping over the times it is given; the events are the hub's own names (a fixed set),
    never anything a peer chose, so the table stays small.
    """

    def __init__(self, *, burst: int = 10, period: float = 1.0) -> None:
        self._burst = burst
        self._period = period
        self._windows: dict[str, tuple[float, int, int]] = {}
        """Per event: when its window began, lines let through in it, lines left out since the last one shown."""

    def allow(self, event: str, now: float) -> int | None:
        """None to leave this line out, else how many lines of ``event`` were left out before it."""
        start, shown, dropped = self._windows.get(event, (now, 0, 0))
        if now - start >= self._period:
            start, shown = now, 0
        if shown >= self._burst:
            self._windows[event] = (start, shown, dropped + 1)
            return None
        self._windows[event] = (start, shown + 1, 0)
        return dropped


def warn_throttled(
    throttle: LogThrottle, log: structlog.typing.FilteringBoundLogger, event: str, **values: object
) -> None:
    """A warning caused by what a peer did, at most a few a second per event (the counters count every one)."""
    dropped = throttle.allow(event, anyio.current_time())
    if dropped is not None:
        log.warning(event, **values, **({"suppressed": dropped} if dropped else {}))
