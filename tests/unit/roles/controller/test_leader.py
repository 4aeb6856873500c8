"""Leader election: the pure decision, the records written, and the elector over an in-memory Lease API."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio
import anyio.abc
import msgspec
import pytest
import structlog
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from nodetask.clock import Clock
from roles.controller.leader import (
    Elector,
    LeadershipLost,
    Move,
    Observation,
    Timing,
    claim,
    decide,
    micro_time,
    released,
)
from roles.kube import ApiError, Conflict, NotFound, Resource
from schemas.core import Lease, LeaseSpec

CLOCK = Clock(base=datetime(2026, 11, 25, 10, 0, tzinfo=UTC))
LOG = structlog.get_logger()
A_HOLDS = LeaseSpec(holder_identity="a", lease_duration_seconds=15, renew_time="2026-11-25T10:00:00.000000Z")


# --------------------------------------------------------------------------------------------- decide


def test_absent_lease_is_created() -> None:
    """No lease at all: create it (and a leader that finds it gone has lost it)."""
    assert decide(None, observed=None, now=0, identity="b", duration=15).move is Move.CREATE
    assert decide(None, observed=None, now=0, identity="b", duration=15, leading=True).move is Move.LOST


def test_own_lease_is_renewed_and_an_empty_one_taken() -> None:
    """Our own record is renewed; a record without holder (released) is taken at once."""
    assert decide(A_HOLDS, observed=None, now=0, identity="a", duration=15).move is Move.RENEW
    empty = msgspec.structs.replace(A_HOLDS, holder_identity=None)
    assert decide(empty, observed=None, now=0, identity="b", duration=15).move is Move.TAKE


def test_live_lease_is_waited_for_from_when_we_first_saw_it() -> None:
    """Another holder's record is waited for until its duration has passed since we first saw it."""
    first = decide(A_HOLDS, observed=None, now=100, identity="b", duration=3)
    assert (first.move, first.until) == (Move.WAIT, 115)
    assert first.observed == Observation(A_HOLDS, 100)
    later = decide(A_HOLDS, observed=first.observed, now=114.9, identity="b", duration=3)
    assert (later.move, later.until) == (Move.WAIT, 115)
    assert decide(A_HOLDS, observed=first.observed, now=115, identity="b", duration=3).move is Move.TAKE


def test_renewal_seen_restarts_the_wait() -> None:
    """A changed record (a renewal) restarts the count, whatever renewTime says: clocks may be skewed."""
    seen = Observation(A_HOLDS, 100)
    renewed = msgspec.structs.replace(A_HOLDS, renew_time="1999-01-01T00:00:00.000000Z")
    decision = decide(renewed, observed=seen, now=114, identity="b", duration=3)
    assert (decision.move, decision.until) == (Move.WAIT, 129)


def test_record_without_duration_uses_ours() -> None:
    """A record with no leaseDurationSeconds lasts our own duration."""
    bare = LeaseSpec(holder_identity="a")
    assert decide(bare, observed=None, now=10, identity="b", duration=3).until == 13


def test_leader_seeing_another_holder_has_lost() -> None:
    """A leader that reads someone else's (or no one's) name has lost the lease, expired or not."""
    for holder in ("b", None):
        spec = msgspec.structs.replace(A_HOLDS, holder_identity=holder)
        assert decide(spec, observed=None, now=0, identity="a", duration=15, leading=True).move is Move.LOST


@given(steps=st.lists(st.tuples(st.floats(0.01, 5), st.booleans()), min_size=1, max_size=40))
def test_a_follower_never_takes_a_lease_renewed_within_its_duration(steps: list[tuple[float, bool]]) -> None:
    """Over any sequence of reads, a follower takes a held lease only once it went unchanged for the duration."""
    spec, now, changed_at, observed = A_HOLDS, 0.0, 0.0, None
    for dt, renewed in steps:
        now += dt
        if renewed:
            spec = msgspec.structs.replace(spec, renew_time=f"t{now}")
            changed_at = now
        decision = decide(spec, observed=observed, now=now, identity="b", duration=15)
        observed = decision.observed
        if decision.move is Move.TAKE:
            assert now - changed_at >= 15
        else:
            assert decision.move is Move.WAIT
            assert observed is not None
            assert now - observed.since < 15


# --------------------------------------------------------------------------------------------- records


def test_taking_over_counts_a_transition_and_renewing_keeps_it() -> None:
    """Taking a lease stamps acquireTime and adds one transition; renewing only moves renewTime."""
    assert claim(None, identity="a", seconds=3, now="T0") == LeaseSpec(
        holder_identity="a", lease_duration_seconds=3, acquire_time="T0", renew_time="T0"
    )
    held = LeaseSpec(
        holder_identity="a", lease_duration_seconds=3, acquire_time="T0", renew_time="T1", lease_transitions=2
    )
    taken = claim(held, identity="b", seconds=15, now="T9")
    assert taken == LeaseSpec(
        holder_identity="b", lease_duration_seconds=15, acquire_time="T9", renew_time="T9", lease_transitions=3
    )
    assert claim(taken, identity="b", seconds=15, now="T10") == msgspec.structs.replace(taken, renew_time="T10")


def test_release_clears_the_holder_and_keeps_transitions() -> None:
    """A released lease names no holder, lasts 1 s and keeps its transition count."""
    held = LeaseSpec(
        holder_identity="a", lease_duration_seconds=3, acquire_time="T0", renew_time="T1", lease_transitions=2
    )
    assert released(held, now="T5") == LeaseSpec(
        lease_duration_seconds=1, acquire_time="T5", renew_time="T5", lease_transitions=2
    )


def test_times_are_micro_times_and_timing_follows_the_duration() -> None:
    """Lease times carry six fractional digits; renewal every third, deadline at two thirds of the duration."""
    assert micro_time(datetime(2026, 11, 25, 10, 0, 1, 5, tzinfo=UTC)) == "2026-11-25T10:00:01.000005Z"
    assert Timing.of(15) == Timing(duration=15, renew_interval=5, renew_deadline=10, retry=2)
    assert Timing.of(2.5).seconds == 3
    with pytest.raises(ValueError, match="at least 1"):
        Timing.of(0.5)


# --------------------------------------------------------------------------------------------- elector


@dataclass
class Leases:
    """One Lease in memory, with the API server's optimistic concurrency on resourceVersion."""

    lease: Lease | None = None
    version: int = 0

    def store(self, lease: Lease) -> Lease:
        self.version += 1
        self.lease = msgspec.structs.replace(
            lease, metadata=msgspec.structs.replace(lease.metadata, resource_version=str(self.version))
        )
        return self.lease


@dataclass
class Client:
    """One instance's connection to :class:`Leases`; ``down`` fails its calls, ``hung`` never answers them."""

    leases: Leases
    down: bool = False
    hung: bool = False
    writes: list[LeaseSpec] = field(default_factory=list)

    async def _round_trip(self) -> None:
        await anyio.sleep(0.01)
        if self.hung:
            await anyio.sleep_forever()
        if self.down:
            raise ApiError(503, "ServiceUnavailable", "the test took the API server away")

    async def get(self, resource: Resource[Lease], name: str, *, namespace: str = "") -> Lease:
        await self._round_trip()
        if self.leases.lease is None:
            raise NotFound(404, "NotFound", name)
        return self.leases.lease

    async def create(self, resource: Resource[Lease], obj: Lease, *, namespace: str = "") -> Lease:
        await self._round_trip()
        if self.leases.lease is not None:
            raise Conflict(409, "AlreadyExists", obj.metadata.name)
        self.writes.append(obj.spec)
        return self.leases.store(obj)

    async def replace(self, resource: Resource[Lease], obj: Lease, *, subresource: str = "") -> Lease:
        await self._round_trip()
        assert self.leases.lease is not None
        if obj.metadata.resource_version != self.leases.lease.metadata.resource_version:
            raise Conflict(409, "Conflict", "the object has been modified")
        self.writes.append(obj.spec)
        return self.leases.store(obj)


def elector(client: Client, identity: str, *, release: bool = True) -> Elector:
    return Elector(
        client,
        name="ctl",
        namespace="kube-system",
        identity=identity,
        duration=3,
        log=LOG,
        clock=CLOCK,
        release=release,
    )


@dataclass
class Worker:
    """Work that records when it started and stopped, and otherwise runs until cancelled or ``seconds`` pass."""

    seconds: float = float("inf")
    started: list[float] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)

    async def __call__(self) -> None:
        self.started.append(anyio.current_time())
        try:
            await anyio.sleep(self.seconds)
        finally:
            self.stopped.append(anyio.current_time())


async def _term_until_lost(
    e: Elector, work: Worker, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    with pytest.raises(LeadershipLost):
        await e.term(work, task_status=task_status)


async def test_only_one_of_two_electors_works(autojump_clock: trio.testing.MockClock) -> None:
    """Two instances on one lease: exactly one works, renewing about every second; the other never writes."""
    leases = Leases()
    a_client, b_client = Client(leases), Client(leases)
    a, b = elector(a_client, "a"), elector(b_client, "b")
    a_work, b_work = Worker(), Worker()
    async with anyio.create_task_group() as tg:
        await tg.start(a.term, a_work)
        tg.start_soon(b.term, b_work)
        await anyio.sleep(30)
        assert (a.is_leader, b.is_leader, b.leader) == (True, False, "a")
        tg.cancel_scope.cancel()
    assert (len(a_work.started), b_work.started, b_client.writes) == (1, [], [])
    assert 28 <= len(a_client.writes) <= 31  # a create, ~30 renewals, the release
    assert leases.lease is not None
    assert leases.lease.spec.holder_identity is None


async def test_work_stops_before_a_follower_may_take_over(autojump_clock: trio.testing.MockClock) -> None:
    """A leader cut off mid-renewal stops at its renew deadline, before the follower's lease wait ends."""
    leases = Leases()
    a_client = Client(leases)
    a, b = elector(a_client, "a", release=False), elector(Client(leases), "b")
    a_work, b_work = Worker(), Worker()
    async with anyio.create_task_group() as tg:
        await tg.start(_term_until_lost, a, a_work)
        tg.start_soon(b.term, b_work)
        await anyio.sleep(10.5)
        a_client.hung = True  # the next renewal never answers
        last_renewal = leases.lease.spec.renew_time if leases.lease else None
        await anyio.sleep(2)
        assert a_work.stopped
        assert not a.is_leader
        assert leases.lease is not None
        assert leases.lease.spec.renew_time == last_renewal
        await anyio.sleep(3)
        tg.cancel_scope.cancel()
    [a_stop], [b_start] = a_work.stopped, b_work.started
    # a last renewed at 10.0 (attempt started then), so its work must end by 10 + 2/3 * 3 = 12.
    assert 11.9 <= a_stop <= 12.0
    assert b_start >= 10.0 + 3
    assert b_start - a_stop >= 1


async def test_work_of_a_cut_off_leader_ends_in_leadership_lost(autojump_clock: trio.testing.MockClock) -> None:
    """A term whose renewals fail raises LeadershipLost after cancelling its work, and writes nothing more."""
    client = Client(Leases())
    a, work = elector(client, "a"), Worker()
    with anyio.fail_after(60):  # virtual seconds: a term that never ends fails instead of hanging
        async with anyio.create_task_group() as tg:
            tg.start_soon(_term_until_lost, a, work)
            await anyio.sleep(5.5)
            client.down = True
    assert work.stopped == [pytest.approx(7.0, abs=0.1)]
    assert not a.is_leader


async def test_clean_exit_releases_and_the_follower_takes_over_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """A leader whose work ends releases the lease; the follower starts within one retry period."""
    leases = Leases()
    a, b = elector(Client(leases), "a"), elector(Client(leases), "b")
    a_work, b_work = Worker(seconds=5), Worker()
    async with anyio.create_task_group() as tg:
        await tg.start(a.term, a_work)
        tg.start_soon(b.term, b_work)
        await anyio.sleep(8)
        tg.cancel_scope.cancel()
    [a_stop], [b_start] = a_work.stopped, b_work.started
    assert 0 < b_start - a_stop <= Timing.of(3).retry * 1.2 + 0.1
    assert leases.lease is not None
    assert leases.lease.spec.lease_transitions == 1  # a created it, b took it over once, then released it
    assert b.leader == ""


async def test_another_holder_stops_the_work_at_the_next_renewal(autojump_clock: trio.testing.MockClock) -> None:
    """When the lease is overwritten with another name, the leader stops at its next renewal, not its deadline."""
    leases = Leases()
    a, work = elector(Client(leases), "a"), Worker()
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_term_until_lost, a, work)
            await anyio.sleep(4.5)
            assert leases.lease is not None
            leases.store(
                msgspec.structs.replace(leases.lease, spec=claim(leases.lease.spec, identity="x", seconds=3, now=""))
            )
    assert work.stopped == [pytest.approx(5.0, abs=0.05)]
    assert leases.lease is not None
    assert leases.lease.spec.holder_identity == "x"


async def test_lead_competes_again_after_a_lost_term(autojump_clock: trio.testing.MockClock) -> None:
    """With lead(), a term lost to an outage is followed by a new term with fresh work once the API is back."""
    client = Client(Leases())
    a, work = elector(client, "a"), Worker()
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.lead, work)
        await anyio.sleep(5.5)
        client.down = True
        await anyio.sleep(3)
        client.down = False
        await anyio.sleep(3)
        assert a.is_leader
        tg.cancel_scope.cancel()
    assert len(work.started) == 2
    assert work.started[1] - work.stopped[0] < 3
