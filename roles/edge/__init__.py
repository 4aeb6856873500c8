"""The edge role: the agent on each device (see :mod:`roles.edge.agent`)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import structlog

from nodetask.clock import Clock
from roles.config import ConfigError, EdgeConfig, RoleConfig
from roles.edge.actions import build_actions
from roles.edge.agent import AgentSettings, EdgeAgent, edge_ssl_context
from roles.edge.checks import Thresholds
from roles.edge.store import StoreError, StoreFault, open_store, quarantine_store
from roles.jobtypes import job_types

Log = structlog.typing.FilteringBoundLogger

STORE_FILE = "store.sqlite"


def agent_version() -> str:
    """This agent's version as KubeEdge writes versions (``v`` + the package version)."""
    return f"v{importlib.metadata.version('nodetaskd')}"


def settings_of(cfg: EdgeConfig) -> AgentSettings:
    """The agent settings an edge configuration asks for; :class:`ConfigError` names what is missing."""
    if not cfg.node_name:
        raise ConfigError("nodeName is required for the edge role")
    if not cfg.hub_urls:
        raise ConfigError("hubUrls needs at least one ws:// or wss:// URL")
    if not cfg.token_file:
        raise ConfigError("tokenFile is required: the node's bearer token for the hubs")
    try:
        token = Path(cfg.token_file).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read tokenFile {cfg.token_file}: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"tokenFile {cfg.token_file} is empty")
    return AgentSettings(
        node=cfg.node_name,
        version=agent_version(),
        hub_urls=cfg.hub_urls,
        token=token,
        data_dir=Path(cfg.data_dir),
        thresholds=Thresholds(cpu=cfg.max_cpu_usage, mem=cfg.max_mem_usage, disk=cfg.max_disk_usage),
        ssl_context=edge_ssl_context(cfg.ca_file) if any(u.startswith("wss://") for u in cfg.hub_urls) else None,
    )


async def run(cfg: RoleConfig, *, log: Log) -> None:
    """Run the edge agent until cancelled."""
    assert isinstance(cfg, EdgeConfig)
    settings = settings_of(cfg)
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
