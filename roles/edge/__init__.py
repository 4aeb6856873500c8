"""The edge role: the agent on each device (see :mod:`roles.edge.agent`)."""

from __future__ import annotations

from pathlib import Path

import structlog

from nodetask.clock import Clock
from roles.config import EdgeConfig, RoleConfig
from roles.edge.actions import build_actions
from roles.edge.agent import AgentSettings, EdgeAgent
from roles.edge.settings import settings_of
from roles.edge.store import StoreError, StoreFault, open_store, quarantine_store
from roles.jobtypes import job_types

Log = structlog.typing.FilteringBoundLogger

STORE_FILE = "store.sqlite"


async def run(cfg: RoleConfig, *, log: Log, config_path: Path | None = None) -> None:
    """Run the edge agent until cancelled."""
    assert isinstance(cfg, EdgeConfig)
    settings = settings_of(cfg, config_file=config_path)
    clock = Clock.start()
    path = settings.data_dir / STORE_FILE
    try:
        await _run(settings, path, clock, log)
    except* StoreError as group:
        error = group.exceptions[0]
        if not isinstance(error, StoreError) or error.fault is not StoreFault.CORRUPT:
            raise
        # A corrupt store would fail every start: keep it for inspection and begin afresh.
        moved = await quarantine_store(path, log=log)
        log.error("store_quarantined", path=str(path), moved_to=str(moved))
        await _run(settings, path, clock, log)


async def _run(settings: AgentSettings, path: Path, clock: Clock, log: Log) -> None:
    async with open_store(path, now=clock.now, log=log) as store:
        agent: EdgeAgent

        def credentials(job_uid: str) -> dict[str, str]:
            return agent.credentials(job_uid)

        agent = EdgeAgent(
            settings=settings,
            store=store,
            actions=build_actions(pull=None, credentials=credentials),
            job_types=job_types(),
            clock=clock,
            log=log,
        )
        await agent.run()
