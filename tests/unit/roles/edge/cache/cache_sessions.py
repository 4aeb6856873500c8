"""A cache.v1 hub's part in the autonomy tests: the cache messages it sends an agent, and how it reads the answers."""

from __future__ import annotations

from typing import Any, Final, TypeVar

import msgspec

from nodetask.autonomy import DISABLED
from nodetask.messages import (
    CACHE_CAPABILITY,
    AutonomyCondition,
    CacheObjects,
    Upstream,
)
from tests.unit.roles.edge.doubles import NODE, Edge, HubSession

CACHE: Final = (CACHE_CAPABILITY,)


M = TypeVar("M", bound=Upstream)


def pod(name: str, rv: int, *, data: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv)},
        "spec": {"nodeName": NODE, "filler": data},
    }


def objects(kind: str, *items: dict[str, Any], replace: bool = False, version: str = "") -> CacheObjects:
    raw = tuple(msgspec.Raw(msgspec.json.encode(item)) for item in items)
    return CacheObjects(kind=kind, objects=raw, replace=replace, resource_version=version)


async def next_of(session: HubSession, kind: type[M]) -> M:
    """The next frame of type ``kind`` from the agent, skipping others."""
    while True:
        frame = await session.receive()
        if isinstance(frame, kind):
            return frame


async def welcomed(edge: Edge) -> HubSession:
    """The agent's next session with a ``cache.v1`` hub, past the condition it sends first (not requested)."""
    session = await edge.hub.accept()
    assert (await next_of(session, AutonomyCondition)).reason == DISABLED
    return session
