"""Lease requests have slots of their own: bulk work filling the client's shared slots does not hold them up."""

from __future__ import annotations

import functools
from typing import Any, cast

import anyio
import msgspec
import structlog
import trio.testing

from roles.kube import Kube
from roles.kube.aio import AioApi
from roles.kube.client import REQUESTS_IN_FLIGHT
from roles.kube.resources import LEASES, TASKS
from schemas.core import Lease, LeaseSpec
from schemas.meta import ObjectMeta


class StuckApi:
    """An API server whose Task requests never finish (until released) while it answers Lease reads at once."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.stuck = 0
        self.lease_reads = 0

    async def request(self, method: str, path: str, **_: Any) -> bytes:
        if "/leases/" in path:
            self.lease_reads += 1
            lease = Lease(metadata=ObjectMeta(name="l", namespace="ns"), spec=LeaseSpec(holder_identity="me"))
            return msgspec.json.encode(lease)
        self.stuck += 1
        await self.release.wait()
        return b"{}"


RENEWALS = 10


async def _direct(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await fn(*args, **kwargs)


async def test_a_lease_read_proceeds_while_every_shared_slot_waits_on_a_stuck_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Twice as many Task deletes as there are shared slots, none answered: the client has sent as many as it
    has slots, and a Lease read (a renewal's first step) is answered meanwhile, repeatedly."""
    api = StuckApi()
    kube = Kube(cast("AioApi", api), log=structlog.get_logger(), cross=_direct)
    async with anyio.create_task_group() as tg:
        for i in range(2 * REQUESTS_IN_FLIGHT):
            tg.start_soon(functools.partial(kube.delete, TASKS, f"t{i}", namespace="ns"))
        await trio.testing.wait_all_tasks_blocked()
        assert api.stuck == REQUESTS_IN_FLIGHT
        with anyio.fail_after(1):
            for _ in range(RENEWALS):
                lease = await kube.get(LEASES, "l", namespace="ns")
                assert lease.spec.holder_identity == "me"
        assert api.lease_reads == RENEWALS
        api.release.set()
    assert api.stuck == 2 * REQUESTS_IN_FLIGHT
