"""The edge agent: one connection to a hub at a time, node tasks walked locally, every result durable.

* A RunAction is stored before it is acknowledged; a task re-delivered with the same job UID and
  attempt is never run again - its latest recorded result is re-sent instead, so a restarted hub
  catches up. A later attempt (the job was retried) is new work: it replaces the earlier one, whose
  walk is stopped first if it still runs; its reports name their attempt, so the hub never mistakes
  them for late reports of the earlier one (nor the reverse).
* Each action's result and its report are written in one store transaction; reports leave the
  outbox in ``seq`` order and only when the hub acknowledges them (or refuses them for good), so
  an agent restart or an outage loses nothing: the outbox is flushed first on every connection.
* Tasks interrupted by an agent restart resume at their first unrecorded action.
* A new diagnosis Task whose request data is over ``diagnosis.maxRequestBytes``, or that arrives while
  the store holds ``storeQuotaBytes``, is stored already failed, without its data, and reported like
  any result (:mod:`roles.edge.task_limits`). A finished task's spec leaves the store with its last
  acknowledged report.
* The connection loop tries the hub URLs in turn with capped, jittered backoff; three silent
  heartbeat intervals count as a dead session.

* Every agent keeps a cache of its node's cloud objects for autonomy (its Hello lists
  ``cache.v1``, and ``cache.secrets`` when it may keep Secrets); the cache's messages are taken only
  from a hub whose Welcome lists ``cache.v1`` (:mod:`roles.edge.cache.autonomy_manager`).
* With the node's API endpoint on, its tunnels go through the session of a hub listing ``tunnel.v1``, and
  its certificate is kept issued through a hub listing ``node-credentials.v1``
  (:mod:`roles.edge.node_api.certificate_keeper`).

This module answers the hub's messages; the parts live beside it: the connection and its one
writer per session (:mod:`roles.edge.session`), the outbox (:mod:`roles.edge.outbox`), the task
walk (:mod:`roles.edge.task_runner`), the local control socket (:mod:`roles.edge.control`) and the
autonomy manager with its cache (:mod:`roles.edge.cache.autonomy_manager`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import anyio
import anyio.abc
import msgspec
import structlog

from flows.diagnosis import job as diagnosis_job
from flows.nodejobs.jobtype import EdgeJobType
from nodetask.clock import Clock
from nodetask.link import OpenLink
from nodetask.messages import (
    ATTEMPTS_CAPABILITY,
    CACHE_CAPABILITY,
    CACHE_CHUNKS_CAPABILITY,
    CACHE_SECRETS_CAPABILITY,
    KUBELET_CAPABILITY,
    NODE_CREDENTIALS_CAPABILITY,
    PING_CAPABILITY,
    TUNNEL_CAPABILITY,
    Ack,
    Autonomy,
    CacheChunk,
    CacheDeleted,
    CacheObjects,
    Cancel,
    Confirm,
    Downstream,
    Error,
    NodeCredentials,
    ReportAck,
    RunAction,
    TunnelClose,
    TunnelCredit,
    TunnelOpened,
    Welcome,
)
from nodetask.registry_credentials import TYPED_CREDENTIALS, RegistryAuth
from roles.edge import task_limits
from roles.edge.cache.autonomy_manager import AutonomyManager
from roles.edge.cache.durable_cache import DurableCache
from roles.edge.context import Actions
from roles.edge.control import serve_control
from roles.edge.node_api.certificate_keeper import CertificateKeeper
from roles.edge.node_api.tunnel_client import TunnelClient
from roles.edge.observed import Observed
from roles.edge.outbox import Outbox
from roles.edge.session import HubConnection, Session
from roles.edge.settings import AgentSettings
from roles.edge.store.records import StoreCounts, TaskState
from roles.edge.store.store import EdgeStore, StoreError
from roles.edge.task_runner import TaskRunner
from roles.edge.ws_link import open_ws_link

__all__ = ["EdgeAgent"]

Log = structlog.typing.FilteringBoundLogger

FINAL_ERRORS: Final = frozenset({"report_rejected", "job_gone"})
"""Error codes by which a hub refuses a report for good: the edge drops it."""


@final
class EdgeAgent:
    """Run with :meth:`run`; cancel to stop (the store keeps everything for the next start)."""

    def __init__(
        self,
        *,
        settings: AgentSettings,
        store: EdgeStore,
        actions: Actions,
        job_types: Mapping[str, EdgeJobType],
        clock: Clock,
        log: Log,
        open_link: OpenLink | None = None,
        cache: DurableCache | None = None,
        relisted: Callable[[], object] | None = None,
        tunnels: TunnelClient | None = None,
        certificates: CertificateKeeper | None = None,
    ) -> None:
        """``open_link`` opens the hub links (websockets within the settings' handshake timeout when None);
        ``cache`` is the node's cache of cloud objects (opened over ``store`` at start when None);
        ``relisted`` is called once the hub has relisted it after a reconnect (the local API's
        ``end_watches``); ``tunnels`` opens tunnels to the API server through the hub session for the node's
        API endpoint (:mod:`roles.edge.node_api`), when it is on, and ``certificates`` keeps the node's
        certificate it uses issued."""
        self.settings = settings
        self._store = store
        self._clock = clock
        self._log = log.bind(node=settings.node)
        self._credentials: dict[str, tuple[Mapping[str, RegistryAuth], str]] = {}
        self._outbox = Outbox(store)
        self._cache = cache
        self._relisted = relisted
        self._autonomy: AutonomyManager | None = None
        self._tunnels = tunnels
        self._certificates = certificates
        keep_secrets = cache.keep_secrets if cache is not None else settings.cache_secrets
        self._hub = HubConnection(
            settings=settings,
            open_link=open_link or functools.partial(open_ws_link, handshake_timeout=settings.handshake_timeout),
            capabilities=tuple(
                sorted(
                    {f"{jt}/{action}" for jt, action in actions}
                    | {
                        ATTEMPTS_CAPABILITY,
                        KUBELET_CAPABILITY,
                        CACHE_CAPABILITY,
                        CACHE_CHUNKS_CAPABILITY,
                        PING_CAPABILITY,
                        TYPED_CREDENTIALS,
                    }
                    | ({CACHE_SECRETS_CAPABILITY} if keep_secrets else set())
                    | ({TUNNEL_CAPABILITY} if tunnels is not None else set())
                    | ({NODE_CREDENTIALS_CAPABILITY} if certificates is not None else set())
                )
            ),
            outbox=self._outbox,
            dispatch=self._dispatch,
            log=self._log,
            started=self._session_started,
            tunnel_data=None if tunnels is None else tunnels.data,
        )
        self._tasks = TaskRunner(
            settings=settings,
            store=store,
            actions=actions,
            job_types=job_types,
            clock=clock,
            outbox=self._outbox,
            wait_connected=self._hub.wait_connected,
            send_now=self._hub.send_now,
            log=self._log,
            ended=self._forget_credentials,
            read_node=self._own_node,
        )

    @property
    def connected(self) -> anyio.Event:
        """Set while a hub session is up."""
        return self._hub.connected

    @property
    def connects(self) -> int:
        """Hub sessions established since the agent started."""
        return self._hub.connects

    async def wait_connected(self, within: float) -> bool:
        """Whether a hub session is (or becomes, within ``within`` seconds) established."""
        return await self._hub.wait_connected(within)

    def credentials(self, job_uid: str) -> tuple[Mapping[str, RegistryAuth], str]:
        """Registry credentials the hub sent with this job's RunAction, and its reason when it sent none.

        Kept in memory only, and only until the task ends: never written to disk. After an agent
        restart the hub re-sends them with the RunAction that resynchronises the task, before a
        resumed pull needs them.
        """
        return self._credentials.get(job_uid, ({}, ""))

    def _forget_credentials(self, job_uid: str) -> None:
        self._credentials.pop(job_uid, None)

    async def _own_node(self) -> Mapping[str, Any] | None:
        """This device's Node as the cache holds it (None before :meth:`run` has opened the cache)."""
        if self._autonomy is None:
            return None
        return await self._autonomy.cache.get("Node", "", self.settings.node)

    async def status(self) -> Mapping[str, str]:
        """The agent's own state, for the ``agent.status`` diagnosis collector: ``version``, ``node``,
        ``store`` (``ok`` or why not), ``outboxDepth`` (reports not yet acknowledged; empty when the store
        fails), ``hub`` (the hub of the current session, empty when there is none) and ``connected``."""
        try:
            depth, store = str(await self._store.outbox_depth()), "ok"
        except StoreError as exc:
            depth, store = "", str(exc)
        return {
            "version": self.settings.version,
            "node": self.settings.node,
            "store": store,
            "outboxDepth": depth,
            "hub": self._hub.hub,
            "connected": "true" if self._hub.connected.is_set() else "false",
        }

    async def observe(self) -> Observed:
        """The agent's counts for its metrics, read now (:class:`~roles.edge.observed.Observed`)."""
        try:
            counts, problem = await self._store.counts(), ""
        except StoreError as exc:
            counts, problem = StoreCounts(tasks={}, outbox_depth=0, dropped=0, used_bytes=0), str(exc)
        autonomy = self._autonomy
        ledger = autonomy.cache.ledger if autonomy is not None else None
        verdict = autonomy.state.verdict if autonomy is not None else None
        return Observed(
            tasks=counts.tasks, outbox_depth=counts.outbox_depth, reports_dropped=counts.dropped,
            store_bytes=counts.used_bytes, store_problem=problem,
            connected=self._hub.connected.is_set(), sessions=self._hub.connects,
            error_keys=len(ledger.errors) if ledger is not None else 0,
            ledger_persisted=ledger.persisted if ledger is not None else False,
            autonomy_requested=ledger.requested if ledger is not None else False,
            autonomy_condition=str(verdict.status) if verdict is not None else "",
        )  # fmt: skip

    async def _status_line(self) -> bytes:
        """What ``nodetaskd edge status`` shows: the agent and its hub, and :meth:`observe`'s counts, as JSON."""
        observed = await self.observe()
        connected = "true" if observed.connected else "false"
        who = {
            "version": self.settings.version,
            "node": self.settings.node,
            "hub": self._hub.hub,
            "connected": connected,
        }
        return msgspec.json.encode({**who, "observed": msgspec.to_builtins(observed)})

    @property
    def autonomy(self) -> AutonomyManager:
        """The autonomy manager: the cache, its ledger (error keys, whether persisted) and the last check.

        Errors: RuntimeError before :meth:`run` has started."""
        if self._autonomy is None:
            raise RuntimeError("the agent has not started")
        return self._autonomy

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Resume stored tasks, then keep a hub connection until cancelled."""
        cache = self._cache
        if cache is None:
            cache = await DurableCache.open(
                self._store, self.settings.data_dir, keep_secrets=self.settings.cache_secrets, log=self._log
            )
        self._autonomy = AutonomyManager(
            cache,
            log=self._log,
            relisted=self._relisted,
            check_period=self.settings.check_period,
            repair_period=self.settings.repair_period,
        )
        async with anyio.create_task_group() as work:
            work.start_soon(self._autonomy.run_checks)
            work.start_soon(self._tasks.prune)
            await work.start(self._tasks.run)
            control = functools.partial(
                serve_control,
                self.settings.data_dir,
                store=self._store,
                confirm=self.confirm,
                status=self._status_line,
                log=self._log,
            )
            await work.start(control)
            task_status.started()
            await self._hub.run()

    async def confirm(self, job_uid: str, attempt: int = 0) -> bool:
        """Release a task waiting for confirmation (at ``attempt``; 0: whichever); it resumes with the action
        after its confirmation point."""
        return await self._tasks.confirm(job_uid, attempt)

    async def _dispatch(self, msg: Downstream, session: Session) -> None:
        match msg:
            case RunAction():
                await self._on_run_action(msg, session)
            case ReportAck(seq=seq):
                await self._outbox.acknowledge(seq)
            case Error(code=code, ref=ref, message=text) if code in FINAL_ERRORS and ref.isdigit():
                self._log.warning("report_refused", seq=int(ref), code=code, error=text)
                await self._outbox.drop(int(ref), f"{code}: {text}")
            case Error(code=code, message=text):
                self._log.warning("hub_error", code=code, error=text)
            case Confirm(job_uid=uid, attempt=attempt):
                await self.confirm(uid, attempt)
            case Cancel(job_uid=uid, attempt=attempt):
                self._tasks.cancel(uid, attempt)
            case CacheObjects() | CacheDeleted() | Autonomy() if CACHE_CAPABILITY in session.capabilities:
                await self.autonomy.handle(msg)
            case CacheChunk() if {CACHE_CAPABILITY, CACHE_CHUNKS_CAPABILITY} <= session.capabilities:
                await self.autonomy.handle(msg)
            case TunnelOpened() | TunnelCredit() | TunnelClose() if self._tunnels is not None:
                self._tunnels.handle(msg)
            case NodeCredentials() if self._certificates is not None:
                self._certificates.handle(msg)
            case _:
                pass

    async def _session_started(
        self, session: Session, welcome: Welcome, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        async with anyio.create_task_group() as tg:
            if self._tunnels is not None and TUNNEL_CAPABILITY in welcome.capabilities:
                await tg.start(self._tunnels.serve_session, session)
            if self._certificates is not None and NODE_CREDENTIALS_CAPABILITY in welcome.capabilities:
                await tg.start(self._certificates.serve_session, session.send)
            if CACHE_CAPABILITY in welcome.capabilities:
                secrets = CACHE_SECRETS_CAPABILITY in welcome.capabilities
                await tg.start(functools.partial(self.autonomy.serve_session, session.send, hub_sends_secrets=secrets))
            task_status.started()

    async def _on_run_action(self, run: RunAction, session: Session) -> None:
        attempt = max(run.attempt, 1)  # 0: a hub that knows no attempts, which only sends first ones
        credentials = None
        if run.registry_credentials or run.credentials or run.credentials_error:
            # Loaded by the first job that carries credentials: the registry rules (image references,
            # Docker config files) are mostly the hub's, and an idle agent needs none of them.
            from roles.common.registry_auth import credentials_of  # noqa: PLC0415 (deferred on purpose)

            credentials = credentials_of(run)
        # The attempt this one replaces forgets its credentials as it ends: only then are these kept.
        await self._tasks.end_before(run.job_uid, attempt)
        spec = bytes(run.spec)
        try:
            refusal = await self._refusal(run, spec)
            task, new = await self._store.add_task(
                job_uid=run.job_uid,
                route=str(run.route),
                job_type=run.route.job_type,
                spec=spec,
                run_action_id=run.id,
                action=run.action,
                attempt=attempt,
                refusal=refusal,
                finish_time=self._clock.stamp() if refusal else "",
            )
        except StoreError as exc:
            # Not acknowledged (the hub re-sends it after the next reconnect), but the reason is reported.
            self._log.error("task_not_stored", job=str(run.route), error=str(exc))
            reason = f"the edge cannot store the task: {exc}"
            await self._tasks.report_failure(run.route, run.job_uid, run.action, reason, attempt)
            return
        if credentials is not None and task.attempt == attempt and task.state is not TaskState.FINISHED:
            self._credentials[run.job_uid] = credentials
        await session.send(Ack(id=run.id))
        if new and refusal:
            self._log.warning("task_refused", job=str(run.route), attempt=attempt, reason=refusal)
            self._outbox.grew()
        elif new:
            self._log.info("task_received", job=str(run.route), action=run.action, attempt=attempt)
            self._tasks.start(task.job_uid, task.attempt)
        elif not self._tasks.running(task.job_uid):
            await self._outbox.resend_latest(task)

    async def _refusal(self, run: RunAction, spec: bytes) -> str:
        """Why a diagnosis Task is refused if it is new (:mod:`roles.edge.task_limits`), or "" when it is not.

        Errors: :class:`StoreError` when the store cannot say how much it holds."""
        if run.route.job_type != diagnosis_job.RESOURCE_TYPE:
            return ""
        refusal = task_limits.request_refusal(spec, self.settings.max_request_bytes)
        if not refusal:
            used = await self._store.used_bytes()
            refusal = task_limits.quota_refusal(used, self.settings.store_quota_bytes)
        return refusal
