"""The edge agent's settings, derived from (and checked against) its configuration."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from roles.config import ConfigError, EdgeConfig
from roles.edge.agent import AgentSettings, edge_ssl_context
from roles.edge.checks import Thresholds

VERSION_FILE = Path(__file__).resolve().parents[2] / "VERSION"
"""Beside the packages when the agent runs from an installed upgrade (``<dataDir>/versions/<v>/VERSION``)."""


def agent_version() -> str:
    """This agent's version as KubeEdge writes versions (``v`` + the package version).

    An installed upgrade shares the base installation's virtualenv, whose package metadata still
    names the base version: its own ``VERSION`` file says which version this code is.
    """
    try:
        installed = VERSION_FILE.read_text().strip()
    except OSError:
        installed = ""
    return installed or f"v{importlib.metadata.version('nodetaskd')}"


def settings_of(cfg: EdgeConfig, *, config_file: Path | None = None) -> AgentSettings:
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
        config_file=config_file,
        health_deadline=cfg.config_update_health_deadline,
    )
