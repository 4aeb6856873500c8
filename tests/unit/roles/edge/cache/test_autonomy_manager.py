"""The agent's side of edge autonomy against a fake hub: its cache messages, the condition, the repair loop.

Same setting as ``test_edge_agent``: the real agent and store, a fake hub over memory links, virtual time.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Final

import anyio
import msgspec
import pytest
from trio.testing import MockClock

from nodetask import cache_chunks
from nodetask.autonomy import CACHE_FAILED, DISABLED, ENABLED
from nodetask.messages import (
    CACHE_CAPABILITY,
    CACHE_CHUNKS_CAPABILITY,
    CACHE_SECRETS_CAPABILITY,
    Autonomy,
    AutonomyCondition,
    CacheChunk,
    CacheDeleted,
    CacheFetch,
    CacheKey,
)
from roles.edge.cache.autonomy_manager import CHECK_PERIOD_S, RELIST_GRACE_S, REPAIR_PERIOD_S
from roles.edge.store.store import EdgeStore, StoreError
from tests.unit.roles.edge.cache.cache_sessions import CACHE, next_of, objects, pod, welcomed
from tests.unit.roles.edge.doubles import NODE, Edge, HubSession, running_edge

PAGE: Final = 4096


def pod_key(name: str) -> CacheKey:
    return CacheKey(kind="Pod", namespace="default", name=name)


async def fill(store: EdgeStore) -> list[str]:
    """Facts written until the store is full; their keys, to free the space again."""
    written: list[str] = []
    for i in itertools.count():
        try:
            await store.set_fact(f"filler-{i}", "x" * PAGE)
        except StoreError:
            return written
        written.append(f"filler-{i}")
    raise AssertionError("unreachable")


async def test_the_hello_lists_the_cache_and_its_secrets_only_when_allowed(tmp_path: Path, clock: MockClock) -> None:
    """Every agent offers ``cache.v1``; ``cache.secrets`` only with Secrets allowed (``localApi.serveSecrets``)."""
    async with running_edge(tmp_path / "a") as edge:
        await edge.hub.accept()
        assert CACHE_CAPABILITY in edge.hub.hellos[0].capabilities
        assert CACHE_SECRETS_CAPABILITY not in edge.hub.hellos[0].capabilities
    async with running_edge(tmp_path / "b", cache_secrets=True) as edge:
        await edge.hub.accept()
        assert {CACHE_CAPABILITY, CACHE_SECRETS_CAPABILITY} <= set(edge.hub.hellos[0].capabilities)


async def test_a_hub_without_the_cache_gets_no_condition_and_is_not_listened_to(
    tmp_path: Path, clock: MockClock
) -> None:
    """A hub whose Welcome lacks ``cache.v1`` is sent no condition, and cache frames from it are ignored."""
    async with running_edge(tmp_path) as edge:
        session = await edge.hub.accept()
        await session.send(Autonomy(requested=True))
        await session.send(objects("Pod", pod("web", 3)))
        await anyio.sleep(3 * CHECK_PERIOD_S)
        assert edge.agent.autonomy.checks >= 3
        assert session.nothing_received()
        assert not edge.agent.autonomy.cache.ledger.requested
        assert await edge.agent.autonomy.cache.get("Pod", "default", "web") is None


async def test_the_condition_follows_the_request_and_is_sent_again_on_every_session(
    tmp_path: Path, clock: MockClock
) -> None:
    """Autonomy requested gives True, withdrawn False, each sent when it changes; a new session gets the
    current one at its start, so the hub is never left with a stale condition."""
    async with running_edge(tmp_path, capabilities=CACHE) as edge:
        first = await edge.hub.accept()
        assert (await next_of(first, AutonomyCondition)).reason == DISABLED
        await first.send(Autonomy(requested=True))
        condition = await next_of(first, AutonomyCondition)
        assert (condition.status, condition.reason) == ("True", ENABLED)
        await first.link.close()

        second = await edge.hub.accept()
        assert await next_of(second, AutonomyCondition) == condition
        await second.send(Autonomy(requested=False))
        assert (await next_of(second, AutonomyCondition)).reason == DISABLED


async def test_the_request_survives_a_restart_and_is_checked_offline(tmp_path: Path, clock: MockClock) -> None:
    """Whether autonomy is requested is kept across an agent restart: checked while no hub answers, and
    the first session then gets the condition it led to."""
    async with running_edge(tmp_path, capabilities=CACHE) as edge:
        session = await welcomed(edge)
        await session.send(Autonomy(requested=True))
        while (await next_of(session, AutonomyCondition)).reason != ENABLED:
            pass
    async with running_edge(tmp_path, capabilities=CACHE, refuse=10**6) as edge:
        await anyio.sleep(2 * CHECK_PERIOD_S)
        verdict = edge.agent.autonomy.state.verdict
        assert verdict is not None
        assert verdict.reason == ENABLED
        assert edge.agent.autonomy.cache.ledger.requested
        edge.hub.refuse = 0
        session = await edge.hub.accept()
        assert (await next_of(session, AutonomyCondition)).reason == ENABLED


async def test_cache_frames_reach_the_cache(tmp_path: Path, clock: MockClock) -> None:
    """Upserts, relists and deletions from a ``cache.v1`` hub land in the agent's durable cache."""
    async with running_edge(tmp_path, capabilities=CACHE) as edge:
        session = await welcomed(edge)
        await session.send(objects("Pod", pod("a", 3), pod("b", 4), replace=True, version="5"))
        await session.send(objects("Pod", pod("a", 6)))
        await session.send(CacheDeleted(key=pod_key("b"), resource_version="7"))
        await session.send(Autonomy(requested=True))  # answered after the frames before it
        assert (await next_of(session, AutonomyCondition)).reason == ENABLED
        listing = await edge.agent.autonomy.cache.list("Pod", "default")
        assert [(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in listing.items] == [("a", "6")]
        assert listing.resource_version == "7"


async def test_watches_end_once_every_kind_is_relisted_after_a_welcome(tmp_path: Path, clock: MockClock) -> None:
    """The local API's watches end when the hub has relisted every kind the edge takes (Secrets only when
    allowed); a session in which a kind never comes ends them after the grace period all the same."""
    ended: list[float] = []
    second_end = anyio.Event()

    def relisted() -> None:
        ended.append(anyio.current_time())
        if len(ended) == 2:
            second_end.set()

    async with running_edge(tmp_path, capabilities=CACHE, relisted=relisted) as edge:
        session = await welcomed(edge)
        await session.send(objects("Node", {"metadata": {"name": NODE, "resourceVersion": "2"}}, replace=True))
        await session.send(objects("Pod", replace=True))
        await session.send(Autonomy(requested=True))  # answered after the frames before it
        await next_of(session, AutonomyCondition)
        assert ended == []
        await session.send(objects("ConfigMap", replace=True))
        await session.send(Autonomy(requested=False))
        await next_of(session, AutonomyCondition)
        assert len(ended) == 1
        await session.link.close()

        second = await edge.hub.accept()
        await second.send(objects("Pod", replace=True))
        await second_end.wait()
        assert ended[1] - second.welcomed_at == pytest.approx(RELIST_GRACE_S, abs=1.0)


async def test_an_edge_keeping_secrets_awaits_no_secret_relist_from_a_hub_that_sends_none(
    tmp_path: Path, clock: MockClock
) -> None:
    """An edge that keeps Secrets ends its watches once a hub whose Welcome lacks ``cache.secrets`` (its
    ``cacheSecrets`` is off: it never sends one) has relisted the other kinds, not a grace period later;
    from a hub listing it, the Secrets' relist is awaited too."""
    ended: list[float] = []

    def relisted() -> None:
        ended.append(anyio.current_time())

    def by_relist(session: HubSession) -> list[bool]:
        # Virtual time jumps while the store writes in a thread: what tells a relist from the grace
        # period running out is which side of it the watches ended on.
        return [t - session.welcomed_at < RELIST_GRACE_S for t in ended]

    async def relist(session: HubSession, *kinds: str) -> None:
        for kind in kinds:
            await session.send(objects(kind, replace=True))
        await session.send(Autonomy(requested=not edge.agent.autonomy.cache.ledger.requested))
        await next_of(session, AutonomyCondition)  # answered after the frames before it

    async with running_edge(tmp_path, capabilities=CACHE, cache_secrets=True, relisted=relisted) as edge:
        session = await welcomed(edge)
        await relist(session, "Node", "Pod", "ConfigMap")
        assert by_relist(session) == [True]

    async with running_edge(
        tmp_path, capabilities=(*CACHE, CACHE_SECRETS_CAPABILITY), cache_secrets=True, relisted=relisted
    ) as edge:
        ended.clear()
        session = await edge.hub.accept()
        await next_of(session, AutonomyCondition)  # the current one, sent at the session's start
        await relist(session, "Node", "Pod", "ConfigMap")
        assert True not in by_relist(session)
        await relist(session, "Secret")
        assert by_relist(session) == [True]


def pod_chunks(replace: str, version: str, *items: dict[str, Any]) -> tuple[CacheChunk, ...]:
    """A Pod replace in chunks of one Pod each (each Pod a few hundred bytes)."""

    def key_of(body: msgspec.Raw) -> CacheKey:
        return pod_key(msgspec.json.decode(body)["metadata"]["name"])

    raw = [msgspec.Raw(msgspec.json.encode(item)) for item in items]
    return cache_chunks.split("Pod", raw, replace=replace, resource_version=version, limit=600, key_of=key_of)


async def cached_pods(edge: Edge) -> dict[str, str]:
    listing = await edge.agent.autonomy.cache.list("Pod", "default")
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in listing.items}


async def test_a_replace_in_chunks_cut_short_by_the_connection_leaves_the_pods_and_the_next_one_swaps_them(
    tmp_path: Path, clock: MockClock
) -> None:
    """The Hello lists ``cache.chunks``. From a hub listing it too, a Pod replace in chunks cut short by the
    connection leaves the cached Pods as they were; the next session's swaps them all at its last chunk
    (a Pod deleted meanwhile is gone) and counts as the Pods' relist."""
    ended: list[float] = []
    async with running_edge(
        tmp_path, capabilities=(*CACHE, CACHE_CHUNKS_CAPABILITY), relisted=lambda: ended.append(anyio.current_time())
    ) as edge:
        session = await welcomed(edge)
        assert CACHE_CHUNKS_CAPABILITY in edge.hub.hellos[0].capabilities
        await session.send(objects("Pod", pod("a", 3), pod("gone", 4), replace=True, version="5"))
        fresh = [pod(name, 8, data="x" * 300) for name in ("a", "b", "c")]
        parts = pod_chunks("1", "9", *fresh)
        assert len(parts) == 3
        for part in parts[:2]:
            await session.send(part)
        await session.send(Autonomy(requested=True))  # answered after the frames before it
        assert (await next_of(session, AutonomyCondition)).reason == ENABLED
        assert await cached_pods(edge) == {"a": "3", "gone": "4"}
        await session.link.close()

        second = await edge.hub.accept()
        await next_of(second, AutonomyCondition)  # the current one, sent at the session's start
        ended.clear()
        await second.send(objects("Node", {"metadata": {"name": NODE, "resourceVersion": "2"}}, replace=True))
        await second.send(objects("ConfigMap", replace=True))
        await second.send(parts[2])  # the end of the first session's replace: out of place here
        for part in pod_chunks("2", "9", *fresh):
            await second.send(part)
        await second.send(Autonomy(requested=False))
        assert (await next_of(second, AutonomyCondition)).reason == DISABLED
        assert await cached_pods(edge) == {"a": "8", "b": "8", "c": "8"}
        assert [t - second.welcomed_at < RELIST_GRACE_S for t in ended] == [True]


async def test_chunks_from_a_hub_that_did_not_list_them_are_ignored(tmp_path: Path, clock: MockClock) -> None:
    """A hub whose Welcome lacks ``cache.chunks`` has agreed to none: its chunks change nothing."""
    async with running_edge(tmp_path, capabilities=CACHE) as edge:
        session = await welcomed(edge)
        await session.send(objects("Pod", pod("a", 3), replace=True, version="5"))
        for part in pod_chunks("1", "9", pod("b", 8)):
            await session.send(part)
        await session.send(Autonomy(requested=True))  # answered after the frames before it
        assert (await next_of(session, AutonomyCondition)).reason == ENABLED
        assert await cached_pods(edge) == {"a": "3"}


async def test_keys_that_fail_to_store_go_unknown_on_the_fourth_check_and_are_repaired(
    tmp_path: Path, clock: MockClock
) -> None:
    """On a full store an object's key is errored: the condition stays True for three checks and turns
    Unknown on the fourth, naming the key; the repair loop asks for it every period, and once space is
    freed the hub's answer is stored, the key cleared and the condition True again."""
    async with running_edge(tmp_path, capabilities=CACHE, store_max_bytes=64 * PAGE) as edge:
        session = await welcomed(edge)
        await session.send(Autonomy(requested=True))
        assert (await next_of(session, AutonomyCondition)).reason == ENABLED
        fillers = await fill(edge.store)
        await session.send(objects("Pod", pod("web", 3, data="y" * 4 * PAGE)))
        autonomy = edge.agent.autonomy
        unknown = await next_of(session, AutonomyCondition)
        assert (unknown.status, unknown.reason) == ("Unknown", CACHE_FAILED)
        assert unknown.message.startswith("Pod/default/web: edge store ")
        assert unknown.message.endswith("is full: database or disk is full")
        assert autonomy.state.failing == 4, "the fourth failing check, not before"
        assert autonomy.cache.ledger.persisted

        fetch = await next_of(session, CacheFetch)
        assert fetch.keys == (pod_key("web"),)
        for key in fillers:
            await edge.store.delete_fact(key)
        await session.send(objects("Pod", pod("web", 3, data="y" * 4 * PAGE)))
        assert (await next_of(session, AutonomyCondition)).reason == ENABLED
        assert autonomy.cache.ledger.errors == {}
        assert await autonomy.cache.get("Pod", "default", "web") is not None


async def test_the_repair_loop_asks_again_every_period_while_keys_stay_errored(
    tmp_path: Path, clock: MockClock
) -> None:
    """Errored keys are asked for once per repair period, in one CacheFetch, while they stay errored."""
    async with running_edge(tmp_path, capabilities=CACHE) as edge:
        session = await welcomed(edge)
        bad = {"metadata": {"name": "web", "namespace": "default", "resourceVersion": "not-a-number"}}
        await session.send(objects("Pod", bad))
        arrivals = []
        for _ in range(3):
            fetch = await next_of(session, CacheFetch)
            assert fetch.keys == (pod_key("web"),)
            arrivals.append(anyio.current_time() - session.welcomed_at)
        # The mock clock jumps while the ledger's file writes run in worker threads (as long as they take on
        # a loaded machine), so the period is checked between fetches, not counted from the welcome.
        gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
        assert arrivals[0] >= REPAIR_PERIOD_S
        assert gaps == pytest.approx([REPAIR_PERIOD_S, REPAIR_PERIOD_S], abs=1.0)
