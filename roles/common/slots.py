"""Places a server gives its connections: a fixed number in all, and a share of them per peer address.

The hub's front door (:mod:`roles.cloud.transport.ingress`) and every HTTP listener (:mod:`roles.common.httpserver`:
the controller's webhook and metrics ports, the hub's HTTP endpoint, the edge's local API) count
their connections with these, so that a peer opening connections it never uses costs a bounded
amount of memory and descriptors. A place is taken without waiting when one is free; the caller
decides what to do when none is (close the connection at once, or wait a moment for one).

Only anyio: the edge's base install serves its local API with them.
"""

from __future__ import annotations

from typing import Literal, final

import anyio

__all__ = ["PeerSlots", "Refusal", "Slots"]

Refusal = Literal["total", "per_peer"]
"""Which cap a connection met: the server's total, or its peer's share."""


@final
class Slots:
    """``total`` places of one kind, taken without waiting; the accept loop may wait for one to be free."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._freed: anyio.Event | None = None

    def take(self) -> bool:
        """Take a place if one is free."""
        if self.used >= self.total:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        """Give back a place taken with :meth:`take`."""
        assert self.used > 0, "a place given back that was never taken"
        self.used -= 1
        if self._freed is not None:
            self._freed.set()
            self._freed = None

    async def wait_free(self) -> None:
        """Return once a place is free (it is not taken: whoever comes next may take it)."""
        while self.used >= self.total:
            if self._freed is None:
                self._freed = anyio.Event()
            await self._freed.wait()


@final
class PeerSlots:
    """``total`` places in all, of which one peer address holds at most ``per_peer``.

    The table has an entry only for peers holding a place, so it never outgrows ``total``.
    """

    def __init__(self, *, total: int, per_peer: int) -> None:
        self.all = Slots(total)
        self.per_peer = per_peer
        self._held: dict[str, int] = {}

    def take(self, peer: str) -> Refusal | None:
        """Take a place for ``peer``; None when taken, else the cap that refused it."""
        held = self._held.get(peer, 0)
        if held >= self.per_peer:
            return "per_peer"
        if not self.all.take():
            return "total"
        self._held[peer] = held + 1
        return None

    def give(self, peer: str) -> None:
        """Give back a place ``peer`` took."""
        held = self._held.get(peer, 0)
        assert held > 0, "a place given back that its peer never took"
        if held == 1:
            del self._held[peer]
        else:
            self._held[peer] = held - 1
        self.all.give()

    def held(self, peer: str) -> int:
        """Places ``peer`` holds now."""
        return self._held.get(peer, 0)
