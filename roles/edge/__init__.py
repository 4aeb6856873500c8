"""The edge role: the agent on each device (see :mod:`roles.edge.agent`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import structlog

from nodetask.clock import Clock
from roles.config import EdgeConfig, RoleConfig
from roles.edge.actions import AuthFor, PullImages, build_actions
from roles.edge.agent import AgentSettings, EdgeAgent
from roles.edge.settings import settings_of
from roles.edge.store import StoreError, StoreFault, open_store, quarantine_store
from roles.jobtypes import job_types
from schemas.v1alpha2 import ImageStatus

Log = structlog.typing.FilteringBoundLogger

STORE_FILE = "store.sqlite"


async def run(cfg: RoleConfig, *, log: Log, config_path: Path | None = None) -> None:
    """Run the edge agent until cancelled."""
    assert isinstance(cfg, EdgeConfig)
    settings = settings_of(cfg, config_file=config_path)
    clock = Clock.start()
    path = settings.data_dir / STORE_FILE
    try:
        await _run(settings, cfg.cri_endpoint, path, clock, log)
    except* StoreError as group:
        error = group.exceptions[0]
        if not isinstance(error, StoreError) or error.fault is not StoreFault.CORRUPT:
            raise
        # A corrupt store would fail every start: keep it for inspection and begin afresh.
        moved = await quarantine_store(path, log=log)
        log.error("store_quarantined", path=str(path), moved_to=str(moved))
        await _run(settings, cfg.cri_endpoint, path, clock, log)


def _puller(cri_endpoint: str, log: Log) -> PullImages:
    """Image pulls through the runtime at ``cri_endpoint``, a channel per pull.

    grpcio and protobuf are imported on the first pull, not at start: they are about a third of an
    idle agent's memory (docs/benchmarks.md, edge footprint), and most devices pull rarely.
    """

    async def pull(images: tuple[str, ...], retry_times: int, auth_for: AuthFor) -> tuple[ImageStatus, ...]:
        from roles.edge.runtime import open_image_service, pull_images  # noqa: PLC0415 (deferred on purpose)

        async with open_image_service(cri_endpoint) as service:
            return await pull_images(service, images, retry_times=retry_times, auth_for=auth_for, log=log)

    return pull


async def _run(settings: AgentSettings, cri_endpoint: str, path: Path, clock: Clock, log: Log) -> None:
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(path, now=clock.now, log=log))
        pull: PullImages | None = None
        if cri_endpoint:
            pull = _puller(cri_endpoint, log)
        else:
            log.warning("no_container_runtime", hint="criEndpoint is empty: image pulls will fail")
        agent: EdgeAgent

        def credentials(job_uid: str) -> tuple[Mapping[str, str], str]:
            return agent.credentials(job_uid)

        agent = EdgeAgent(
            settings=settings,
            store=store,
            actions=build_actions(pull=pull, credentials=credentials),
            job_types=job_types(),
            clock=clock,
            log=log,
        )
        await agent.run()
