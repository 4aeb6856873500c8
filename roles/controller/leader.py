"""Leader election through a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Only one controller instance may act: two would both time nodes out and both write Events. An
instance holds the lease by renewing ``renewTime``; another may take it over once the record has not
changed for ``leaseDurationSeconds``, measured from when *it* saw the record change on its own
monotonic clock (as client-go does), so clock skew between machines does not matter, only clock rate.

The work runs inside a cancel scope whose deadline is the last successful renewal attempt's start
plus ``renew_deadline`` (two thirds of the duration). Another instance cannot take over before that
attempt's start plus the full duration, so the work has stopped before anyone else may start. Seeing
another holder ends the work at once. Every write is conditional on ``resourceVersion``: of two
instances racing for an expired lease, the second gets a 409 and keeps waiting.

Renewals must not wait behind the controller's other requests: a stage creating or deleting a
thousand Tasks fills the client's shared slots for seconds. Requests for Leases have slots of their
own (``roles.kube.resources.LEASES`` is a priority resource), so the Elector shares the client.

:func:`decide` and :func:`claim` are the pure part; :class:`Elector` does the reading and writing.
"""

from __future__ import annotations

import enum
import math
import random
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, final

import anyio
import anyio.abc
import msgspec
import structlog

from nodetask.clock import Clock
from roles.kube import ApiError, Conflict, NotFound, Resource
from roles.kube.resources import LEASES
from roles.kube.retrying import Outage
from schemas.core import Lease, LeaseSpec
from schemas.meta import ObjectMeta

__all__ = [
    "Decision",
    "Elector",
    "LeadershipLost",
    "LeaseApi",
    "Move",
    "Observation",
    "Timing",
    "claim",
    "decide",
    "default_identity",
    "micro_time",
    "released",
]

Log = structlog.typing.FilteringBoundLogger
Work = Callable[[], Awaitable[None]]


def default_identity() -> str:
    """``<hostname>_<uuid>``, as client-go's callers build it: unique even for two instances on one host."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def micro_time(moment: datetime) -> str:
    """A ``metav1.MicroTime``: RFC 3339 in UTC with exactly six fractional digits, which the API server requires."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Timing:
    """How often to renew and retry, and when to give up, all derived from the lease duration."""

    duration: float
    """Seconds a lease lasts without renewal, as other instances measure it."""
    renew_interval: float
    """Seconds between successful renewals."""
    renew_deadline: float
    """Seconds after a successful renewal attempt started by which the work stops unless renewed again."""
    retry: float
    """Seconds between attempts while waiting for the lease or after a failed renewal."""

    @classmethod
    def of(cls, duration: float) -> Timing:
        """client-go's ratios (15 s lease, 10 s renew deadline, 2 s retry), renewing every third of the lease."""
        if duration < 1:
            raise ValueError(f"a lease lasts whole seconds: duration must be at least 1, got {duration}")
        return cls(
            duration=duration, renew_interval=duration / 3, renew_deadline=duration * 2 / 3, retry=duration / 7.5
        )

    @property
    def seconds(self) -> int:
        """``leaseDurationSeconds``: rounded up, so others never wait less than our own deadline assumes."""
        return math.ceil(self.duration)


class Move(enum.StrEnum):
    """What one round of the election does."""

    CREATE = "create"
    """No lease exists: create it holding it."""
    TAKE = "take"
    """Nobody holds the lease, or its holder let it expire: take it over."""
    RENEW = "renew"
    """We hold the lease: renew it."""
    WAIT = "wait"
    """Another instance holds a live lease."""
    LOST = "lost"
    """We were leading, but the lease now names someone else (or no one): stop working at once."""


@dataclass(frozen=True, slots=True)
class Observation:
    """A lease record and the local loop time at which we first saw it (client-go's observedTime)."""

    spec: LeaseSpec
    since: float


@dataclass(frozen=True, slots=True)
class Decision:
    move: Move
    observed: Observation | None
    until: float = math.inf
    """For :attr:`Move.WAIT`: the loop time at which the holder's lease runs out, by our observation."""


def decide(
    spec: LeaseSpec | None,
    *,
    observed: Observation | None,
    now: float,
    identity: str,
    duration: float,
    leading: bool = False,
) -> Decision:
    """One round of client-go's ``tryAcquireOrRenew``, without the I/O.

    ``spec`` is the lease as read (None when absent), ``observed`` what we saw before, ``now`` the
    loop time, ``duration`` our own lease duration (used when the record has none).
    """
    if spec is None:
        return Decision(Move.LOST if leading else Move.CREATE, None)
    seen = observed if observed is not None and observed.spec == spec else Observation(spec, now)
    holder = spec.holder_identity or ""
    if holder == identity:
        return Decision(Move.RENEW, seen)
    if leading:
        return Decision(Move.LOST, seen)
    if not holder:
        return Decision(Move.TAKE, seen)
    until = seen.since + (spec.lease_duration_seconds or duration)
    if now < until:
        return Decision(Move.WAIT, seen, until)
    return Decision(Move.TAKE, seen)


def claim(spec: LeaseSpec | None, *, identity: str, seconds: int, now: str) -> LeaseSpec:
    """The record to write to hold the lease: a renewal keeps the acquire time and transition count."""
    if spec is not None and spec.holder_identity == identity:
        return msgspec.structs.replace(spec, lease_duration_seconds=seconds, renew_time=now)
    return LeaseSpec(
        holder_identity=identity,
        lease_duration_seconds=seconds,
        acquire_time=now,
        renew_time=now,
        lease_transitions=None if spec is None else (spec.lease_transitions or 0) + 1,
    )


def released(spec: LeaseSpec, *, now: str) -> LeaseSpec:
    """The record that gives the lease up: no holder, and a 1 s duration for readers that ignore the holder."""
    return LeaseSpec(
        lease_duration_seconds=1, acquire_time=now, renew_time=now, lease_transitions=spec.lease_transitions
    )


class LeaseApi(Protocol):
    """The three calls the election makes; :class:`~roles.kube.Kube` has them, tests use an in-memory fake."""

    async def get(self, resource: Resource[Lease], name: str, *, namespace: str = "") -> Lease: ...

    async def create(self, resource: Resource[Lease], obj: Lease, *, namespace: str = "") -> Lease: ...

    async def replace(self, resource: Resource[Lease], obj: Lease, *, subresource: str = "") -> Lease: ...


class LeadershipLost(Exception):
    """The lease could not be renewed before the renew deadline, or another instance took it; the work was stopped."""


@final
class Elector:
    """Competes for one Lease on behalf of one instance.

    Long-lived: :attr:`is_leader` and :attr:`leader` outlive terms, for metrics and health checks.
    Run the work with :meth:`lead` (terms for as long as the instance runs) or :meth:`term` (one).
    """

    def __init__(
        self,
        kube: LeaseApi,
        *,
        name: str,
        namespace: str,
        identity: str,
        duration: float,
        log: Log,
        clock: Clock | None = None,
        release: bool = True,
    ) -> None:
        self._kube = kube
        self._name = name
        self._namespace = namespace
        self.identity = identity
        self.timing = Timing.of(duration)
        self._clock = clock or Clock.start()
        self._release_on_exit = release
        self._log = log.bind(lease=f"{namespace}/{name}", identity=identity)
        self._observed: Observation | None = None
        self._lease: Lease | None = None
        """The newest lease object read or written: its resourceVersion makes the next write conditional."""
        self.is_leader = False
        """True while this instance's work runs."""
        self.leader = ""
        """The holder last seen in the lease (empty if none)."""

    async def lead(self, work: Work) -> None:
        """Run ``work`` whenever this instance holds the lease, until cancelled or until ``work`` returns.

        ``work`` is called afresh for every term, so it should build its state (a new reconciler)
        rather than resume a stopped one's cache.
        """
        while True:
            try:
                await self.term(work)
            except LeadershipLost:
                continue  # logged where it happened; compete again like any follower
            return

    async def term(self, work: Work, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Wait for the lease, run ``work`` while it is held, then give the lease up.

        Ready (``task_status.started()``) once the lease is held and ``work`` is about to start.

        Cancellation: ``work`` is cancelled too, and the lease is released (when ``release`` was
        asked for) under a shielded 5 s scope, so a successor starts at once.

        Errors:
            :class:`LeadershipLost` when renewal failed until the renew deadline or another holder
            was seen; ``work`` has been cancelled by then. Errors from ``work`` propagate (in an
            exception group); the lease is released first.
        """
        valid_until = await self._acquire()
        self.is_leader = True
        task_status.started()
        lost = False
        try:
            async with anyio.create_task_group() as tg:
                # The work's scope carries the renew deadline; the renewer pushes it back on each renewal.
                with anyio.CancelScope(deadline=valid_until) as scope:
                    tg.start_soon(self._renew, scope)
                    await work()
                lost = scope.cancelled_caught
                tg.cancel_scope.cancel()
        finally:
            self.is_leader = False
            if not lost and self._release_on_exit:
                with anyio.move_on_after(5, shield=True):
                    await self._release()
        if lost:
            raise LeadershipLost(f"lost lease {self._namespace}/{self._name}")

    async def _acquire(self) -> float:
        """Compete until we hold the lease; returns the loop time by which it must be renewed."""
        self._log.info("leadership_wanted", duration_s=self.timing.duration)
        failures = Outage(self._log, "lease_attempt_failed")  # retried at the lease's own pace, logged once
        while True:
            started = anyio.current_time()
            try:
                decision = await self._attempt(leading=False)
            except Conflict:
                continue  # another instance wrote first; the next read shows who
            except ApiError as exc:
                failures.noted(exc)
                await anyio.sleep(self._jittered_retry())
                continue
            failures.recovered()
            if decision.move is not Move.WAIT:
                self._log.info("leadership_acquired", move=decision.move)
                return started + self.timing.renew_deadline
            await anyio.sleep(min(self._jittered_retry(), max(0.0, decision.until - anyio.current_time())))

    async def _renew(self, scope: anyio.CancelScope) -> None:
        """Renew until the work's scope ends; cancel it at once when another holder shows up."""
        last = scope.deadline - self.timing.renew_deadline
        failures = Outage(self._log, "lease_renewal_failed")
        while True:
            await anyio.sleep_until(last + self.timing.renew_interval)
            renewed = False
            with anyio.move_on_at(scope.deadline):
                while not renewed:
                    started = anyio.current_time()
                    try:
                        decision = await self._attempt(leading=True)
                    except Conflict:
                        continue  # someone wrote the lease: the next read says whether it is still ours
                    except ApiError as exc:
                        failures.noted(exc)
                        await anyio.sleep(self.timing.retry)
                        continue
                    failures.recovered()
                    if decision.move is Move.LOST:
                        self._log.warning("leadership_lost", holder=self.leader, why="taken")
                        scope.cancel()
                        return
                    last = started
                    scope.deadline = started + self.timing.renew_deadline
                    renewed = True
            if not renewed:
                # The work's own deadline has passed too (it is the same time): it is being cancelled.
                self._log.warning("leadership_lost", why="renew_deadline_passed")
                return

    async def _attempt(self, *, leading: bool) -> Decision:
        """Read the lease, decide, and write it when the decision is to hold it."""
        now = anyio.current_time()
        try:
            current: Lease | None = await self._kube.get(LEASES, self._name, namespace=self._namespace)
        except NotFound:
            current = None
        decision = decide(
            None if current is None else current.spec,
            observed=self._observed,
            now=now,
            identity=self.identity,
            duration=self.timing.duration,
            leading=leading,
        )
        self._observed = decision.observed
        self._lease = current
        self.leader = "" if current is None else current.spec.holder_identity or ""
        if decision.move in (Move.WAIT, Move.LOST):
            return decision
        spec = claim(
            None if current is None else current.spec,
            identity=self.identity,
            seconds=self.timing.seconds,
            now=micro_time(self._clock.now()),
        )
        if current is None:
            lease = Lease(metadata=ObjectMeta(name=self._name, namespace=self._namespace), spec=spec)
            written = await self._kube.create(LEASES, lease, namespace=self._namespace)
        else:
            written = await self._kube.replace(LEASES, msgspec.structs.replace(current, spec=spec))
        self._lease = written
        self._observed = Observation(written.spec, anyio.current_time())
        self.leader = self.identity
        return decision

    async def _release(self) -> None:
        """Clear the holder, so that a waiting instance takes over now instead of after the duration."""
        if self._lease is None or self._lease.spec.holder_identity != self.identity:
            return
        try:
            # Read afresh: a renewal cancelled mid-flight may have landed, making our last copy stale.
            lease = await self._kube.get(LEASES, self._name, namespace=self._namespace)
            if lease.spec.holder_identity != self.identity:
                return
            spec = released(lease.spec, now=micro_time(self._clock.now()))
            self._lease = await self._kube.replace(LEASES, msgspec.structs.replace(lease, spec=spec))
        except ApiError as exc:
            # A 409 means someone else wrote since our read: it is no longer ours to release.
            self._log.warning("lease_not_released", error=str(exc))
            return
        self.leader = ""
        self._log.info("leadership_released")

    def _jittered_retry(self) -> float:
        # Jitter keeps candidates that started together from reading and writing in lockstep.
        return self.timing.retry * random.uniform(1.0, 1.2)
