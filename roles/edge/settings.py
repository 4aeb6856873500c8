"""The edge agent's settings, derived from (and checked against) its configuration."""

from __future__ import annotations

import importlib.metadata
import ssl
from pathlib import Path

import msgspec

from roles.common.config import ConfigError, EdgeConfig
from roles.edge.checks.checks import Thresholds

__all__ = ["AgentSettings", "agent_version", "client_tls", "edge_ssl_context", "settings_of"]

VERSION_FILE = Path(__file__).resolve().parents[2] / "VERSION"
"""Beside the packages when the agent runs from an installed upgrade (``<dataDir>/versions/<v>/VERSION``)."""


class AgentSettings(msgspec.Struct, frozen=True):
    """What the agent needs from the edge configuration."""

    node: str
    version: str
    hub_urls: tuple[str, ...]
    token: str
    data_dir: Path
    thresholds: Thresholds
    ssl_context: ssl.SSLContext | None = None
    reconnect_cap: float = 30.0
    """The longest wait between two attempts to reach a hub (``reconnectMaxDelay``)."""
    handshake_timeout: float = 30.0
    """How long one attempt to reach a hub may take (``handshakeTimeout``)."""
    missed_heartbeats: int = 3
    config_file: Path | None = None
    """The YAML file this agent was started with; config updates rewrite it."""
    health_deadline: float = 60.0
    cache_secrets: bool = False
    """Whether the node's Secrets are cached (``localApi.serveSecrets``): the Hello then lists ``cache.secrets``."""
    repair_period: float = 30.0
    """How often errored cache keys are asked for again (``autonomy.repairPeriod``)."""
    check_period: float = 10.0
    """How often the Autonomy condition is checked (``autonomy.checkPeriod``)."""
    task_retention: float = 7 * 24 * 3600.0
    """Seconds a finished task is kept after it was received, once its reports are acknowledged."""
    store_quota_bytes: int = 64 << 20
    """Bytes the store may hold before new diagnosis Tasks are refused (``storeQuotaBytes``)."""
    max_request_bytes: int = 128 << 10
    """The most bytes of request data a diagnosis Task may carry (``diagnosis.maxRequestBytes``)."""
    max_concurrent_tasks: int = 4
    """Diagnosis Tasks walked at once; the others wait their turn (``diagnosis.maxConcurrentTasks``)."""


def edge_ssl_context(ca_file: str) -> ssl.SSLContext | None:
    """A client TLS context trusting ``ca_file`` (the system roots when empty)."""
    return ssl.create_default_context(cafile=ca_file or None)


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


def client_tls(cfg: EdgeConfig) -> ssl.SSLContext | None:
    """The TLS context for ``wss://`` hubs (also checked whenever ``caFile`` is set, so a bad one is found
    at start); :class:`ConfigError` names ``caFile`` and its path when the file cannot be used."""
    if not cfg.ca_file and not any(u.startswith("wss://") for u in cfg.hub_urls):
        return None
    try:
        return edge_ssl_context(cfg.ca_file)
    except ssl.SSLError as exc:  # before OSError, which it is a subclass of
        raise ConfigError(f"caFile {cfg.ca_file} holds no usable PEM certificate ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read caFile {cfg.ca_file}: {exc.strerror or exc}") from None


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
        ssl_context=client_tls(cfg),
        config_file=config_file,
        health_deadline=cfg.config_update_health_deadline,
        reconnect_cap=cfg.reconnect_max_delay,
        handshake_timeout=cfg.handshake_timeout,
        cache_secrets=cfg.local_api.serve_secrets or cfg.node_api.enabled,
        repair_period=cfg.autonomy.repair_period,
        check_period=cfg.autonomy.check_period,
        store_quota_bytes=cfg.store_quota_bytes,
        max_request_bytes=cfg.diagnosis.max_request_bytes,
        max_concurrent_tasks=cfg.diagnosis.max_concurrent_tasks,
    )
