"""One job's dispatch on one hub: a node task per connected node, under the job's concurrency.

A runner belongs to one job UID. It starts a node task in the shared pool for every target node
connected to this hub that is Pending (to be claimed) or already InProgress (adopted after a hub
restart or an edge moving between hubs: the edge resumes from its own store and re-sends its
reports). A node task:

1. claims the node through the status writer, which is what bounds concurrency across hubs
   (a claim only succeeds while fewer than ``concurrency`` nodes are InProgress); a claim that finds
   every slot taken waits until the newest copy of the job shows one free, as a change that frees
   none would only cost a read of the job;
2. sends ``RunAction`` to the node's session, and again on every reconnect until the node settles
   (the edge is idempotent per job UID and attempt, so this is how unacknowledged sends are retried);
3. ends when the node's entry leaves InProgress (a final report, or the controller's Unknown),
   or when ``timeoutSeconds`` since its dispatch have passed.

The pool token is held across all three in one ``async with`` (see :mod:`nodetask.pool`).

A retried job runs again under a new runner (:attr:`JobRunner.run_number`), like a first run. A
retried node (attempt above 1) whose agent does not announce ``messages.ATTEMPTS_CAPABILITY`` is
failed instead of dispatched: such an agent keys its task by job UID alone and would take the retry
for a re-delivery of the first attempt, resend that attempt's result and never run again. Likewise a
node of a ``component: kubelet`` job whose agent does not announce ``messages.KUBELET_CAPABILITY``: such an
agent ignores the field and would take the job for one about itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc
import msgspec
import structlog

from flows.nodejobs.changes import ClaimOutcome, awaits_confirmation, claim, full, refuse
from flows.nodejobs.jobtype import JobType
from nodetask.clock import Clock, parse_time
from nodetask.messages import ATTEMPTS_CAPABILITY, KUBELET_CAPABILITY, Cancel, Confirm, RunAction
from nodetask.phases import ConditionStatus, NodeTaskPhase
from nodetask.pool import JobPool, NodeTaskEnd, open_job_pool
from nodetask.registry_credentials import TYPED_CREDENTIALS
from nodetask.route import Route
from roles.cloud.jobs.status_writer import StatusWriter
from roles.cloud.sessions import Session, SessionTable
from roles.common.registry_auth import RegistryAuth, encode_credentials
from roles.kube import ApiError, NotFound
from roles.kube.retrying import Outage
from schemas import v1alpha2
from schemas.access import targeting

Log = structlog.typing.FilteringBoundLogger

CANCEL_GRACE_S = 2.0
RETRY_INITIAL = 0.5
RETRY_CAP = 10.0
"""The backoff of a claim or refusal the API server failed (seconds)."""


class JobRunner:
    """Dispatches job ``job.metadata.uid`` to this hub's sessions until stopped."""

    def __init__(
        self,
        *,
        job: Any,
        job_type: JobType,
        sessions: SessionTable,
        writer: StatusWriter,
        clock: Clock,
        log: Log,
        credentials: Mapping[str, RegistryAuth] | None = None,
        credentials_error: str = "",
        on_dispatch: Callable[[float], None] = lambda _: None,
    ) -> None:
        self.uid: str = job.metadata.uid
        self.name: str = job.metadata.name
        self.run_number: int = run_number(job)
        """The job's run this runner dispatches (1, then one more per retry)."""
        self.job = job
        self._type = job_type
        self._sessions = sessions
        self._writer = writer
        self._clock = clock
        self._log = log.bind(job=self.name, uid=self.uid)
        self._credentials = dict(credentials or {})
        # For agents without the TYPED_CREDENTIALS capability, which read only the string form.
        self._credential_strings = {image: encode_credentials(auth) for image, auth in self._credentials.items()}
        self._credentials_error = credentials_error
        self._on_dispatch = on_dispatch
        self._spec = msgspec.Raw(msgspec.json.encode(job.spec))
        self._changed = anyio.Event()
        self._entries: dict[str, Any] | None = None
        """The current copy's node entries by name, built on first use after each update."""
        self._full: bool | None = None
        """Whether the current copy has every concurrency slot taken, found on first use after each update."""
        self._stop = anyio.Event()
        self._pool: JobPool | None = None
        self.finished = anyio.Event()
        self._sent: set[str] = set()
        """Nodes sent a RunAction whose task has not settled: they get a Cancel if the job goes."""
        self.dispatched: list[tuple[str, float]] = []
        """(node, loop time) of every claim this runner made, for tests and benchmarks."""

    # ------------------------------------------------------------------------------- driven by the hub

    def update(self, job: Any) -> None:
        """A newer copy of the job (from the watch or from a write)."""
        self.job = job
        self._entries = None
        self._full = None
        self._changed.set()
        self._changed = anyio.Event()

    def stop(self) -> None:
        """Interrupt every node task; :attr:`finished` is set once they have all unwound."""
        self._stop.set()

    def offer(self, node: str) -> None:
        """Start ``node``'s task if it targets this job, is connected here and still needs work."""
        pool = self._pool
        if pool is None or node in pool or node not in self._sessions:
            return
        entry = self._entry(node)
        if entry is None or entry.phase not in (NodeTaskPhase.PENDING, NodeTaskPhase.IN_PROGRESS):
            return
        pool.start(node, lambda: self._node_task(node), timeout=math.inf, on_end=self._ended)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`stop`; node tasks already dispatched go first, then Pending ones in order."""
        try:
            async with open_job_pool(uid=self.uid, concurrency=targeting(self.job).effective_concurrency) as pool:
                self._pool = pool
                entries = self.job.status.node_status
                for phase in (NodeTaskPhase.IN_PROGRESS, NodeTaskPhase.PENDING):
                    for entry in entries:
                        if entry.phase is phase:
                            self.offer(entry.node_name)
                task_status.started()
                await self._stop.wait()
                pool.interrupt()
            await self._cancel_on_edges()
        finally:
            self.finished.set()

    async def _cancel_on_edges(self) -> None:
        """Tell the edges still working on this job that it is gone (best effort, bounded)."""
        with anyio.move_on_after(CANCEL_GRACE_S):
            for node in sorted(self._sent):
                session = self._sessions.get(node)
                if session is not None:
                    route = Route(v1alpha2.API_VERSION, self._type.resource_type, self.name, node)
                    entry = self._entry(node)
                    attempt = entry.attempt if entry is not None else 0
                    await session.send(Cancel(route=route, job_uid=self.uid, attempt=attempt))
                    self._log.info("node_task_cancelled", node=node, attempt=attempt)

    # ---------------------------------------------------------------------------------- node tasks

    def _entry(self, node: str) -> Any:
        # Every node task looks its entry up after every job change: one dict per copy, not a scan per call.
        if self._entries is None:
            self._entries = {entry.node_name: entry for entry in self.job.status.node_status}
        return self._entries.get(node)

    def _ended(self, node: str, end: NodeTaskEnd) -> None:
        if end is not NodeTaskEnd.FINISHED:
            self._log.info("node_task_ended", node=node, end=end)

    async def _node_task(self, node: str) -> None:
        log = self._log.bind(node=node)
        entry = self._entry(node)
        if entry is not None and entry.phase is NodeTaskPhase.PENDING:
            if await self._refused(node, entry.attempt, log):
                return
            if not await self._claim(node, log):
                return
        entry = self._entry(node)
        if entry is None or entry.phase is not NodeTaskPhase.IN_PROGRESS:
            return
        with anyio.move_on_at(self._deadline(entry)) as scope:
            await self._serve(node, log)
        if scope.cancelled_caught:
            log.warning("node_task_timed_out", timeout=targeting(self.job).effective_timeout)

    def _unable(self, session: Session, attempt: int) -> tuple[str, str]:
        """(the capability ``session``'s agent lacks for this node task, the node's reason), or ("", "")."""
        if attempt > 1 and ATTEMPTS_CAPABILITY not in session.capabilities:
            return ATTEMPTS_CAPABILITY, (
                f"the agent on this node (version {session.version}) cannot run a retry: it does not announce the"
                f" capability {ATTEMPTS_CAPABILITY!r} and would take attempt {attempt} for the first one again;"
                " upgrade the agent, or run the node in a new job"
            )
        spec = self.job.spec
        on_kubelet = (
            isinstance(spec, v1alpha2.NodeUpgradeJobSpec | v1alpha2.ConfigUpdateJobSpec)
            and spec.component is v1alpha2.NodeComponent.KUBELET
        )
        if on_kubelet and KUBELET_CAPABILITY not in session.capabilities:
            return KUBELET_CAPABILITY, (
                f"the agent on this node (version {session.version}) cannot act on the kubelet: it does not announce"
                f" the capability {KUBELET_CAPABILITY!r} and would take this job for one about itself; upgrade the"
                " agent"
            )
        return "", ""

    async def _refused(self, node: str, attempt: int, log: Log) -> bool:
        """Fail a node whose agent cannot run its task (:meth:`_unable`) instead of dispatching it; whether it was."""
        session = self._sessions.get(node)
        if session is None:
            return False
        capability, reason = self._unable(session, attempt)
        if not capability:
            return False
        outage = Outage(log, "refusal_failed", initial=RETRY_INITIAL, cap=RETRY_CAP)
        while True:
            try:
                refused: bool = await self._writer.submit(refuse(node, uid=self.uid, attempt=attempt, reason=reason))
            except NotFound:
                return True
            except ApiError as exc:
                await outage.wait(exc)
                continue
            outage.recovered()
            if refused:
                log.warning("node_refused_old_agent", attempt=attempt, version=session.version, lacks=capability)
            return True

    async def _claim(self, node: str, log: Log) -> bool:
        outage = Outage(log, "claim_failed", initial=RETRY_INITIAL, cap=RETRY_CAP)
        while True:
            changed = self._changed
            try:
                outcome = await self._writer.submit(claim(node, uid=self.uid, now=self._clock.stamp()))
            except NotFound:
                return False
            except ApiError as exc:
                await outage.wait(exc)
                continue
            outage.recovered()
            match outcome:
                case ClaimOutcome.CLAIMED:
                    self.dispatched.append((node, anyio.current_time()))
                    log.info("node_dispatched")
                    return True
                case ClaimOutcome.FULL:
                    # Most changes of a job free no slot (reports of its running nodes, another hub's
                    # claims, this claim's own fresh read): trying again on each would cost a read of
                    # the job every time. At least one change, then one that may have freed a slot.
                    # Meanwhile the pool's token goes to the next node: when other hubs' nodes hold the
                    # slots, that may be one of theirs adopted here (its hub gone), which must run to
                    # free a slot at all.
                    assert self._pool is not None  # node tasks run in it
                    async with self._pool.token_lent():
                        await changed.wait()
                        while not self._may_claim(node):
                            await self._changed.wait()
                case _:
                    log.info("node_not_claimed", outcome=outcome)
                    return False

    def _may_claim(self, node: str) -> bool:
        """Whether a claim of Pending ``node`` is worth trying on the newest copy of the job: a slot is free, or
        the node is no longer Pending (the claim then says what became of it)."""
        entry = self._entry(node)
        if entry is None or entry.phase is not NodeTaskPhase.PENDING:
            return True
        if self._full is None:
            self._full = full(self.job)
        return not self._full

    def _deadline(self, entry: Any) -> float:
        timeout = targeting(self.job).effective_timeout
        try:
            return self._clock.loop_time(parse_time(entry.dispatch_time)) + timeout
        except ValueError:
            return anyio.current_time() + timeout

    def _next_action(self, entry: Any) -> str:
        flow = self._type.flow
        if not entry.action_flow:
            return flow.first
        last = entry.action_flow[-1]
        return flow.next(last.action, last.status is ConditionStatus.TRUE) or flow.first

    async def _serve(self, node: str, log: Log) -> None:
        """(Re)send the node's action on every session until its entry leaves InProgress."""
        async with anyio.create_task_group() as tg:

            async def until_settled() -> None:
                while (entry := self._entry(node)) is not None and entry.phase is NodeTaskPhase.IN_PROGRESS:
                    await self._changed.wait()
                self._sent.discard(node)  # settled: nothing to cancel on the edge
                tg.cancel_scope.cancel()

            tg.start_soon(until_settled)
            sends = 0
            claimed_at = anyio.current_time()
            while True:
                session = await self._sessions.wait_for(node)
                sends += 1
                typed = TYPED_CREDENTIALS in session.capabilities
                route = Route(v1alpha2.API_VERSION, self._type.resource_type, self.name, node)
                entry = self._entry(node)
                attempt = entry.attempt if entry is not None else 1
                msg = RunAction(
                    id=f"{self.uid}/{node}/{sends}" if attempt == 1 else f"{self.uid}/{node}/{attempt}.{sends}",
                    route=route,
                    job_uid=self.uid,
                    action=self._next_action(entry),
                    spec=self._spec,
                    credentials={} if typed else self._credential_strings,
                    credentials_error=self._credentials_error,
                    registry_credentials=self._credentials if typed else {},
                    attempt=attempt,
                )
                session.expect_ack(msg.id)
                if await session.send(msg):
                    self._sent.add(node)
                    log.debug("run_action_sent", action=msg.action, attempt=sends)
                    if sends == 1:
                        self._on_dispatch(anyio.current_time() - claimed_at)
                async with anyio.create_task_group() as this_session:
                    this_session.start_soon(self._confirm_when_asked, node, session, route, log)
                    await session.closed.wait()
                    this_session.cancel_scope.cancel()

    async def _confirm_when_asked(self, node: str, session: Session, route: Route, log: Log) -> None:
        """Send Confirm once the node waits for confirmation and the job's annotation releases it."""
        while not awaits_confirmation(self.job, node):
            await self._changed.wait()
        entry = self._entry(node)
        attempt = entry.attempt if entry is not None else 0
        if await session.send(Confirm(route=route, job_uid=self.uid, attempt=attempt)):
            log.info("confirm_sent", attempt=attempt)


def run_number(job: Any) -> int:
    """The job's run: 1, then one more per retry (``status.retry.attempt``)."""
    retry = job.status.retry
    return retry.attempt if retry is not None else 1
