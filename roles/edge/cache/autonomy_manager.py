"""The autonomy manager (seed 003's): the cache's messages from the hub, the periodic check, the repair loop.

* The hub's cache messages go to the durable cache (:mod:`roles.edge.cache.durable_cache`), and its
  :class:`~nodetask.messages.Autonomy` to the ledger, so that whether autonomy is requested
  survives a restart and is known offline.
* Every :data:`CHECK_PERIOD_S`, connected or not, :func:`nodetask.autonomy.check` runs over the
  ledger's errored keys (and at once when the request changes). A changed condition goes to the
  hub, and the current one again at the start of every session, so the hub never keeps a stale one.
* While a session with a hub that lists ``cache.v1`` lasts, every repair period the errored keys
  are asked for again (:class:`~nodetask.messages.CacheFetch`); the hub's answers are ordinary
  cache messages, whose successful writes take the keys out of the ledger.
* After a reconnect the hub relists every kind (a ``replace`` each, in chunks when too large for one
  frame: what a session before staged of one is dropped as the session starts). Once every kind the edge
  takes has been relisted - or :data:`RELIST_GRACE_S` after the Welcome, when a kind never is
  (the hub could not list it) - ``relisted`` is called: the local API ends its watches, so that
  their clients list again and see what changed while the device was offline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Final, NoReturn, Protocol, final

import anyio
import anyio.abc
import structlog

from nodetask.autonomy import AutonomyCheck, Verdict, check
from nodetask.link import LinkClosed
from nodetask.messages import (
    Autonomy,
    AutonomyCondition,
    CacheChunk,
    CacheDeleted,
    CacheFetch,
    CacheObjects,
    Upstream,
)
from roles.edge.cache.durable_cache import SECRET, STREAMED, DurableCache
from roles.edge.cache.ledger import key_text

__all__ = ["CHECK_PERIOD_S", "FETCH_BATCH", "RELIST_GRACE_S", "REPAIR_PERIOD_S", "AutonomyManager", "Send"]

Log = structlog.typing.FilteringBoundLogger

CHECK_PERIOD_S: Final = 10.0
"""OpenYurt's: the kubelet's node status period, which drives its check."""
REPAIR_PERIOD_S: Final = 30.0
FETCH_BATCH: Final = 100
"""Keys asked for in one CacheFetch."""
RELIST_GRACE_S: Final = 60.0
"""How long after a Welcome the local API's watches wait for every kind to be relisted."""


class Send(Protocol):
    """A session's send: queues a message for the hub; :class:`LinkClosed` once the session has ended."""

    async def __call__(self, msg: Upstream) -> None: ...


@final
class AutonomyManager:
    """Owned by the agent: :meth:`run_checks` runs for as long as it does, :meth:`serve_session` per session."""

    def __init__(
        self,
        cache: DurableCache,
        *,
        log: Log,
        relisted: Callable[[], object] | None = None,
        check_period: float = CHECK_PERIOD_S,
        repair_period: float = REPAIR_PERIOD_S,
    ) -> None:
        self.cache = cache
        self._log = log
        self._relisted = relisted
        self._check_period = check_period
        self._repair_period = repair_period
        self.state = AutonomyCheck()
        """The last check's outcome."""
        self.checks = 0
        """Checks run since the agent started."""
        self._checking = anyio.Lock()
        self._send: Send | None = None
        self._awaiting: set[str] = set()
        """Kinds not yet relisted in this session."""

    def expected_kinds(self, *, hub_sends_secrets: bool) -> frozenset[str]:
        """The kinds the hub relists after each Welcome: what this edge takes and the hub sends (Secrets only
        from a hub whose Welcome lists ``cache.secrets``; one with ``cacheSecrets`` off never relists them)."""
        return STREAMED if self.cache.keep_secrets and hub_sends_secrets else STREAMED - {SECRET}

    # ---------------------------------------------------------------------------------- messages

    async def handle(self, msg: CacheObjects | CacheChunk | CacheDeleted | Autonomy) -> None:
        """Apply one of the hub's cache or autonomy messages."""
        match msg:
            case CacheObjects(replace=True, kind=kind):
                await self.cache.apply(msg)
                self._relist_seen(kind)
            case CacheObjects():
                await self.cache.apply(msg)
            case CacheChunk(kind=kind):
                if await self.cache.apply_chunk(msg):
                    self._relist_seen(kind)
            case CacheDeleted():
                await self.cache.apply_deleted(msg)
            case Autonomy(requested=requested) if requested != self.cache.ledger.requested:
                self._log.info("autonomy_requested" if requested else "autonomy_withdrawn")
                await self.cache.ledger.update(requested=requested)
                await self.check_now()
            case Autonomy():
                pass

    def _relist_seen(self, kind: str) -> None:
        if not self._awaiting:
            return
        self._awaiting.discard(kind)
        if not self._awaiting:
            self._log.info("cache_relisted")
            self._end_watches()

    def _end_watches(self) -> None:
        self._awaiting = set()
        if self._relisted is not None:
            self._relisted()

    # ------------------------------------------------------------------------------------ checks

    async def run_checks(self) -> NoReturn:
        """Check every period until cancelled, online or not; the first check is at once."""
        while True:
            await self.check_now()
            await anyio.sleep(self._check_period)

    async def check_now(self) -> None:
        """One check (:func:`nodetask.autonomy.check`); a changed condition goes to the hub if one is connected."""
        async with self._checking:
            ledger = self.cache.ledger
            before = self.state.verdict
            errors = {key_text(key): reason for key, reason in ledger.errors.items()}
            self.state = check(self.state, requested=ledger.requested, errors=errors)
            self.checks += 1
            verdict = self.state.verdict
            if verdict is None or verdict == before:
                return
            self._log.info(
                "autonomy_condition_changed",
                status=str(verdict.status),
                reason=verdict.reason,
                error_keys=len(errors),
                failing_checks=self.state.failing,
                ledger_persisted=ledger.persisted,
            )
            await self._send_condition(verdict)

    async def _send_condition(self, verdict: Verdict | None) -> None:
        send = self._send
        if send is None or verdict is None:
            return
        # A session that has just ended: the next one sends the condition when it starts.
        with contextlib.suppress(LinkClosed):
            await send(AutonomyCondition(status=str(verdict.status), reason=verdict.reason, message=verdict.message))

    # ----------------------------------------------------------------------------------- session

    async def serve_session(
        self,
        send: Send,
        *,
        hub_sends_secrets: bool = False,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """For as long as a session with a ``cache.v1`` hub lasts (cancel it when it ends): send the current
        condition, await the relist, and repair errored keys every period.

        ``hub_sends_secrets``: its Welcome lists ``cache.secrets``. Ready once it awaits the relist, so
        that a relist arriving right after the Welcome counts.
        """
        self._awaiting = set(self.expected_kinds(hub_sends_secrets=hub_sends_secrets))
        self._send = send
        await self.cache.drop_staging()
        try:
            async with anyio.create_task_group() as tg:
                task_status.started()
                async with self._checking:
                    await self._send_condition(self.state.verdict)
                tg.start_soon(self._relist_deadline)
                await self._repair(send)
        finally:
            self._send = None
            self._awaiting = set()

    async def _relist_deadline(self) -> None:
        await anyio.sleep(RELIST_GRACE_S)
        if self._awaiting:
            self._log.warning("cache_relist_incomplete", missing=sorted(self._awaiting))
            self._end_watches()

    async def _repair(self, send: Send) -> NoReturn:
        while True:
            await anyio.sleep(self._repair_period)
            keys = sorted(self.cache.ledger.errors, key=key_text)
            if not keys:
                continue
            self._log.info("cache_repair", error_keys=len(keys))
            for start in range(0, len(keys), FETCH_BATCH):
                await send(CacheFetch(keys=tuple(keys[start : start + FETCH_BATCH])))
