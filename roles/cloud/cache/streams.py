"""Cache streams: each cache session's edge kept a copy of its node's cloud objects (seed 003).

An edge listing :data:`~nodetask.messages.CACHE_CAPABILITY` in its Hello gets, after Welcome, whether
its node asks for autonomy (:class:`~nodetask.messages.Autonomy`), then each collection of its node's
objects whole (``CacheObjects`` with ``replace``, or in chunks when too large for one frame:
:mod:`~roles.cloud.cache.feed`): its Node, the Pods bound to it, and the ConfigMaps
and Secrets those Pods reference (:mod:`nodetask.pod_references`; Secrets only to an edge that also
lists ``cache.secrets``, and only when the hub's ``cacheSecrets`` is on). Then each change, as an
upsert or a ``CacheDeleted`` - also when an object stops being the node's to see.

How, and at what cost:

* ONE watch per kind for the whole hub, however many sessions: events go through the shared
  :class:`~roles.cloud.cache.index.CacheIndex`, which turns each into frames for the sessions it
  concerns and drops the rest. The hub holds the referenced ConfigMaps and Secrets (once each,
  whoever references them) and, per node, its Pods' versions and references; Pods and Nodes
  themselves go straight from the watch to the edge.
* A session that starts (or falls behind) is filled by lists of its own objects only: its Node and
  its Pods by field selector, each referenced object not held yet by name, at least as recent as
  the watch (from the API server's watch cache). A pool of :data:`WORKERS` tasks runs the lists; a
  list that fails is retried with backoff, and until it succeeds the edge is sent nothing of that
  kind (it keeps what it has).
* Nothing waits on an edge: a session whose queue is full misses the frame and is relisted
  (:mod:`~roles.cloud.cache.feed`).
* ``CacheFetch`` (the edge's repair loop) is answered per key from the index, or for a Node or Pod
  of the node by reading it again; anything the node may not see is answered ``CacheDeleted``.
  An edge chooses how often it asks, so what it may ask for is bounded: a token bucket of keys per
  node (``cache_fetch_burst`` at once, then ``cache_fetch_rate`` a second; a frame naming more than
  is left is refused whole, with an Error naming the settings), which outlives the session so that
  reconnecting does not refill it, and a key whose read is still waiting or under way for the
  session is not read again. (Reads cannot be shared between sessions: a Node or Pod
  is only ever its own node's to see; the objects many nodes share, ConfigMaps and Secrets, are
  answered from the one copy the hub holds, or once the one list of it under way ends.)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import anyio
import anyio.abc
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectSendStream

from nodetask.backoff import Backoff
from nodetask.messages import (
    CACHE_CAPABILITY,
    CACHE_CHUNKS_CAPABILITY,
    CACHE_SECRETS_CAPABILITY,
    CacheDeleted,
    CacheKey,
    CacheObjects,
)
from roles.cloud.api import CacheApi
from roles.cloud.cache.delay_queue import DelayQueue
from roles.cloud.cache.feed import Feed
from roles.cloud.cache.index import CacheIndex
from roles.cloud.cache.objects import CONFIG_MAP, KINDS, NODE, POD, SECRET, Key, head, wire
from roles.cloud.cache.token_bucket import TokenBucket, level, take
from roles.cloud.metrics import HubMetrics
from roles.cloud.sessions import Session
from roles.cloud.settings import HubSettings
from roles.kube import ApiError, Relisted, WatchEvent
from schemas.core import RawObject

__all__ = ["FRAME_LIMIT", "MAX_FETCH_KEYS", "RATE_LIMITED", "WORKERS", "CacheStreams", "Refusal"]

Log = structlog.typing.FilteringBoundLogger

WORKERS: Final = 16
"""Lists run at once for fills and fetches (they share the API client's 64 requests with the rest)."""
FRAME_LIMIT: Final = 1 << 20
"""The largest frame an edge takes (trio-websocket's default message size)."""
MAX_FETCH_KEYS: Final = 256
"""Keys in one CacheFetch; a longer one is refused (the repair loop asks again, in smaller steps)."""
MAX_READS: Final = 256
"""CacheFetch answers per session waiting for a read of the API server; fetches beyond wait for later."""
RATE_LIMITED: Final = "rate_limited"
"""The Error code of a CacheFetch refused for the session's rate of keys."""
RETRY: Final = Backoff(initial=1.0, cap=60.0)
"""Failed lists are retried after 1 s, doubling up to a minute."""
BEHIND_FORGIVEN_S: Final = 300.0
"""A session that kept up this long is relisted at once the next time it falls behind."""


@dataclass(frozen=True, slots=True)
class _Fill:
    feed: Feed
    kind: str


@dataclass(frozen=True, slots=True)
class _FillKey:
    ref: Key


@dataclass(frozen=True, slots=True)
class _Read:
    feed: Feed
    key: CacheKey


_Job = _Fill | _FillKey | _Read


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a CacheFetch is refused: the code and message of the Error frame that answers it."""

    code: str
    message: str


def _retry_delay(failures: int) -> float:
    ceiling = min(RETRY.cap, RETRY.initial * 2.0 ** min(failures, 16))
    return Backoff(initial=ceiling, cap=ceiling).delay()


class CacheStreams:
    """The hub's cache streams; :meth:`run` them, :meth:`attach` each cache session."""

    def __init__(
        self,
        api: CacheApi,
        *,
        settings: HubSettings,
        metrics: HubMetrics,
        log: Log,
        node_events: Callable[[WatchEvent], None] = lambda _: None,
    ) -> None:
        """``node_events`` also takes each event of the Node watch (the hub's one watch of Nodes); it must not raise."""
        self.enabled = settings.cache_streams
        self._fetch_rate = settings.cache_fetch_rate
        self._fetch_burst = settings.cache_fetch_burst
        self._fetch_buckets: dict[str, TokenBucket] = {}
        """What each node's edge may still fetch (kept past its session unless full again: one per node at most)."""
        self._node_events = node_events
        self._secrets = settings.cache_streams and settings.cache_secrets
        self._api = api
        self._metrics = metrics
        self._log = log
        self._jobs: DelayQueue[_Job] = DelayQueue()
        self._key_failures: dict[Key, int] = {}
        self.index = CacheIndex(want=self._want, refill=self._refill, log=log)
        self._listed: set[str] = set()
        metrics.cache_sessions.set_function(lambda: len(self.index.feeds))
        metrics.cache_watches_listed.set_function(lambda: len(self._listed))
        for kind in (CONFIG_MAP, SECRET):
            metrics.cache_objects.labels(kind=kind).set_function(functools.partial(self._held, kind))

    def _held(self, kind: str) -> int:
        return self.index.objects.held()[kind]

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What the hub lists in Welcome: ``cache.secrets`` too when it sends Secrets, so that an edge keeping
        them knows whether a relist of them is to come."""
        if not self.enabled:
            return ()
        if self._secrets:
            return (CACHE_CAPABILITY, CACHE_CHUNKS_CAPABILITY, CACHE_SECRETS_CAPABILITY)
        return (CACHE_CAPABILITY, CACHE_CHUNKS_CAPABILITY)

    def offered(self, session: Session) -> bool:
        """Whether ``session`` takes part: the hub has cache streams on and the edge listed them."""
        return self.enabled and CACHE_CAPABILITY in session.capabilities

    def kinds(self) -> tuple[str, ...]:
        """The kinds watched."""
        return (NODE, POD, CONFIG_MAP, SECRET) if self._secrets else (NODE, POD, CONFIG_MAP)

    # ------------------------------------------------------------------------------- sessions

    def attach(self, session: Session, log: Log) -> None:
        """Start feeding ``session`` (after its Welcome): Autonomy, then each collection as it is listed."""
        secrets = self._secrets and CACHE_SECRETS_CAPABILITY in session.capabilities
        chunks = CACHE_CHUNKS_CAPABILITY in session.capabilities
        feed = Feed(
            session, secrets=secrets, chunks=chunks, frame_limit=FRAME_LIMIT, log=log, on_behind=self._on_behind
        )
        self.index.attach(feed)
        for kind in (NODE, POD):
            self._jobs.put(_Fill(feed, kind))

    def detach(self, session: Session) -> None:
        """Stop feeding ``session`` (it ended); what no other session needs is forgotten."""
        feed = self.index.feeds.get(session.node)
        if feed is not None and feed.session is session:
            self.index.detach(feed)
            bucket = self._fetch_buckets.get(session.node)
            if bucket is not None and level(bucket, anyio.current_time()) >= bucket.burst:
                del self._fetch_buckets[session.node]  # as good as a new one

    def fetch(self, session: Session, keys: tuple[CacheKey, ...]) -> Refusal | None:
        """Answer a CacheFetch (see the module docstring); why it is refused, or None."""
        feed = self.index.feeds.get(session.node)
        if feed is None or feed.session is not session:
            return Refusal("unexpected", "this session has no cache stream")
        if len(keys) > MAX_FETCH_KEYS:
            return Refusal("unexpected", f"a fetch may name at most {MAX_FETCH_KEYS} keys, got {len(keys)}")
        now = anyio.current_time()
        bucket = self._fetch_buckets.get(feed.node)
        if bucket is None:
            bucket = TokenBucket.full(rate=self._fetch_rate, burst=self._fetch_burst, now=now)
        taken = take(bucket, len(keys), now)
        if taken is None:
            text = (
                f"{len(keys)} keys refused: a node's edge may fetch {self._fetch_burst} keys at once, then"
                f" {self._fetch_rate:g} a second (cacheFetchBurst, cacheFetchRate); ask again later"
            )
            return Refusal(RATE_LIMITED, text)
        self._fetch_buckets[feed.node] = taken
        for key in keys:
            answer = self.index.answer(feed, key.kind, key.namespace, key.name)
            if answer.verdict == "send" and answer.raw is not None:
                feed.push(CacheObjects(kind=key.kind, objects=(answer.raw,)))
            elif answer.verdict == "gone":
                # Without a version (not the node's to see): the edge drops it whatever version it holds.
                feed.push(CacheDeleted(key=key, resource_version=str(answer.rv) if answer.rv else ""))
            elif answer.verdict == "read" and key not in feed.fetching and len(feed.fetching) < MAX_READS:
                feed.fetching.add(key)
                self._jobs.put(_Read(feed, key), first=True)
        return None

    def _on_behind(self, feed: Feed) -> None:
        now = anyio.current_time()
        if now - feed.last_behind > BEHIND_FORGIVEN_S:
            feed.behinds = 0
        delay = 0.0 if feed.behinds == 0 else _retry_delay(feed.behinds - 1)
        feed.behinds += 1
        feed.last_behind = now
        feed.stop()
        self._metrics.cache_relists.inc()
        feed.log.info("cache_session_behind", relist_in_s=round(delay, 2))
        for kind in (NODE, POD):
            self._jobs.put(_Fill(feed, kind), delay)

    def _want(self, ref: Key) -> None:
        # First: one list of a referenced object can complete the collections of many nodes.
        self._jobs.put(_FillKey(ref), first=True)

    def _refill(self, feed: Feed, kind: str) -> None:
        self._jobs.put(_Fill(feed, kind))

    # ------------------------------------------------------------------------------------ run

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch each kind and run the workers until cancelled (ready at once: fills wait for nothing)."""
        async with anyio.create_task_group() as tg:
            await tg.start(self._jobs.run)
            for kind in self.kinds():
                tg.start_soon(self._follow, kind)
            for _ in range(WORKERS):
                tg.start_soon(self._work)
            task_status.started()

    async def _follow(self, kind: str) -> None:
        send, receive = anyio.create_memory_object_stream[WatchEvent](math.inf)
        apply: Callable[[str, WatchEvent], None] = self.index.apply
        async with anyio.create_task_group() as tg, send, receive:
            tg.start_soon(self._watch, kind, send)
            async for event in receive:
                if kind == NODE:
                    self._node_events(event)
                if kind not in self._listed and isinstance(event, Relisted):
                    self._listed.add(kind)
                    self._log.info("cache_watch_listed", kind=kind, objects=len(event.objects))
                try:
                    apply(kind, event)
                except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
                    # Never from a conforming API server; one object the hub cannot read is not cached.
                    self._log.warning("cache_object_unreadable", kind=kind, error=str(exc))

    async def _watch(self, kind: str, send: MemoryObjectSendStream[WatchEvent]) -> None:
        await self._api.watch(KINDS[kind], send)

    async def _work(self) -> None:
        while True:
            job = await self._jobs.get()
            match job:
                case _Fill(feed=feed, kind=kind):
                    await self._fill(feed, kind)
                case _FillKey(ref=ref):
                    await self._fill_key(ref)
                case _Read(feed=feed, key=key):
                    try:
                        await self._read(feed, key)
                    finally:
                        feed.fetching.discard(key)

    async def _fill(self, feed: Feed, kind: str) -> None:
        if not self.index.needs_fill(feed, kind):
            return
        feed.resume()
        version, token = self.index.begin_fill(feed, kind)
        selector = f"spec.nodeName={feed.node}" if kind == POD else f"metadata.name={feed.node}"
        try:
            objects, _, listed = await self._api.list(KINDS[kind], field_selector=selector, resource_version=version)
        except ApiError as exc:
            self.index.fail_fill(feed, kind, token)
            if self.index.feeds.get(feed.node) is feed:
                delay = _retry_delay(feed.failures - 1)
                self._metrics.cache_list_failures.labels(kind=kind).inc()
                feed.log.warning("cache_list_failed", kind=kind, error=str(exc), retry_in_s=round(delay, 2))
                self._jobs.put(_Fill(feed, kind), delay)
            return
        if not self.index.end_fill(feed, kind, token, objects, listed):
            self._refill(feed, kind)  # dropped again unless the node still needs it (needs_fill)

    async def _fill_key(self, ref: Key) -> None:
        begun = self.index.objects.begin_key(ref)
        if begun is None:
            self._key_failures.pop(ref, None)
            return
        version, token = begun
        kind, namespace, name = ref
        try:
            objects, _, listed = await self._api.list(
                KINDS[kind], namespace=namespace, field_selector=f"metadata.name={name}", resource_version=version
            )
        except ApiError as exc:
            if self.index.objects.fail_key(ref, token):
                failures = self._key_failures.get(ref, 0)
                self._key_failures[ref] = failures + 1
                delay = _retry_delay(failures)
                self._metrics.cache_list_failures.labels(kind=kind).inc()
                self._log.warning(
                    "cache_list_failed", kind=kind, namespace=namespace, name=name, error=str(exc), retry_in_s=delay
                )
                self._jobs.put(_FillKey(ref), delay, first=True)
            return
        self._key_failures.pop(ref, None)
        found = next((o for o in objects if _named(o, name)), None)
        self.index.objects.end_key(ref, token, found, listed)

    async def _read(self, feed: Feed, key: CacheKey) -> None:
        """Answer a fetch of the node's own Node or one of its Pods with the object read again."""
        if self.index.feeds.get(feed.node) is not feed:
            return
        selector = f"metadata.name={key.name}"
        try:
            objects, _, listed = await self._api.list(
                KINDS[key.kind],
                namespace=key.namespace,
                field_selector=selector,
                resource_version=self.index.position(key.kind),
            )
        except ApiError as exc:
            feed.log.info("cache_fetch_failed", kind=key.kind, name=key.name, error=str(exc))
            return  # the edge's repair loop asks again
        if not feed.has(key.kind):
            return  # started over meanwhile: the collection follows
        found = next((o for o in objects if _named(o, key.name)), None)
        if found is not None and self.index.may_see(feed, key.kind, found):
            feed.push(CacheObjects(kind=key.kind, objects=(wire(found, key.kind),)))
        else:
            feed.push(CacheDeleted(key=key, resource_version=listed))


def _named(obj: RawObject, name: str) -> bool:
    return head(obj).name == name
