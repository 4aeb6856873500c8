"""The cloud role: the websocket hub edge agents connect to (see :mod:`roles.cloud.hub`)."""

from __future__ import annotations

import dataclasses
import functools
import socket
import urllib.parse
from pathlib import Path

import anyio
import structlog
from prometheus_client import CollectorRegistry

from nodetask.clock import Clock
from roles.cloud.hub import Hub, HubSettings
from roles.cloud.metrics import HubMetrics
from roles.cloud.transport.ingress import connection_limits, fd_limit, raise_fd_limit
from roles.common.cert_reload import ReloadingCertificate
from roles.common.config import CloudConfig, ConfigError, RoleConfig
from roles.common.gc_tuning import tune_gc
from roles.common.health import health_routes, router, serve_http
from roles.common.jobtypes import job_types
from roles.common.ports_file import address_text, check_ports_file, remove_ports_file, write_ports_file
from roles.common.tls import TlsError, load_serving_certificate
from roles.kube import Kube, open_kube


def settings_of(cfg: CloudConfig) -> HubSettings:
    """The hub settings a cloud configuration asks for."""
    return HubSettings(
        hub_id=cfg.hub_id or socket.gethostname(),
        heartbeat_interval=cfg.heartbeat_interval,
        missed_heartbeats=cfg.missed_heartbeats,
        coalesce_window=cfg.status_coalesce_window,
        max_frame_bytes=cfg.max_frame_bytes,
        token_namespace=cfg.token_namespace,
        image_secret_namespaces=cfg.image_secret_namespaces,
        close_grace=cfg.close_grace,
        compact_status_above=cfg.compact_status_above,
        handshake_timeout=cfg.handshake_timeout,
        max_handshakes=cfg.max_handshakes,
        max_sessions=cfg.max_sessions,
        mark_pending_limit=cfg.mark_pending_limit,
        cache_streams=cfg.cache_streams,
        cache_secrets=cfg.cache_secrets,
        cache_fetch_rate=cfg.cache_fetch_rate,
        cache_fetch_burst=cfg.cache_fetch_burst,
        autonomy_condition_interval=cfg.autonomy_condition_interval,
        max_tunnels_per_node=cfg.api_relay.max_tunnels_per_node,
        node_certificate_timeout=cfg.api_relay.certificate_timeout,
    )


def server_tls(cfg: CloudConfig) -> ReloadingCertificate | None:
    """The hub's certificate, followed as its files change, or None for plain ws:// when none is configured.

    Errors: :class:`~roles.common.config.ConfigError` naming the file that cannot be used.
    """
    if not cfg.tls_cert_file:
        return None
    try:
        return ReloadingCertificate(load_serving_certificate(Path(cfg.tls_cert_file), Path(cfg.tls_key_file)))
    except TlsError as exc:
        raise ConfigError(f"tlsCertFile, tlsKeyFile: {exc}") from None


def relay_address(cfg: CloudConfig, server: str) -> tuple[str, int] | None:
    """Where devices' tunnels go: the API server in the hub's kubeconfig, when ``apiRelay.enabled``.

    Errors: :class:`~roles.common.config.ConfigError` when that server is not an https URL.
    """
    if not cfg.api_relay.enabled:
        return None
    url = urllib.parse.urlsplit(server)
    if url.scheme != "https" or not url.hostname:
        raise ConfigError(f"apiRelay.enabled: the API server {server!r} in the kubeconfig is not an https:// URL")
    return url.hostname, url.port or 443


def node_ca_bundle(cfg: CloudConfig, kube: Kube, log: structlog.typing.FilteringBoundLogger) -> bytes | None:
    """The CA bundle sent to devices with their node's certificate, when the hub issues them
    (``apiRelay.enabled`` and ``apiRelay.nodeCertificates``): the one its kubeconfig trusts.

    Errors: :class:`~roles.common.config.ConfigError` when that bundle cannot be read.
    """
    if not (cfg.api_relay.enabled and cfg.api_relay.node_certificates):
        return None
    try:
        bundle = kube.ca_bundle()
    except OSError as exc:
        problem = exc.strerror or exc
        raise ConfigError(f"apiRelay.nodeCertificates: cannot read the kubeconfig's CA: {problem}") from None
    if bundle is None:
        log.warning("node_certificates_off", reason="the kubeconfig names no CA to send devices with their certificate")
    return bundle


async def run(cfg: RoleConfig, *, log: structlog.typing.FilteringBoundLogger, config_path: Path | None = None) -> None:
    """Run one hub until cancelled.

    Once it listens on both ``listen`` and ``httpListen`` and serves edges, it logs ``hub_listening``
    with the addresses it bound (the ports a port 0 got) and writes them to ``portsFile``, if set.
    """
    assert isinstance(cfg, CloudConfig)
    before, after = raise_fd_limit()
    if after != before:
        log.info("file_limit_raised", soft_before=before, soft=after)
    ports_file = Path(cfg.ports_file) if cfg.ports_file else None
    if ports_file is not None:
        check_ports_file("portsFile", ports_file)
    tls = server_tls(cfg)
    if tls is None:
        log.warning("hub_without_tls", hint="set tlsCertFile and tlsKeyFile outside development")
    host, port = cfg.listen_address
    registry = CollectorRegistry()
    async with open_kube(kubeconfig=cfg.kubeconfig, log=log) as kube:
        hub = Hub(
            kube=kube,
            clock=Clock.start(),
            log=log,
            settings=dataclasses.replace(
                settings_of(cfg),
                api_relay=relay_address(cfg, kube.server),
                node_ca_bundle=node_ca_bundle(cfg, kube, log),
            ),
            job_types=job_types(),
            metrics=HubMetrics(
                registry, sessions=lambda: len(hub.sessions), kube=lambda: (kube.writes, kube.conflicts)
            ),
        )
        http_host, http_port = cfg.http_address
        routes = router(
            (*health_routes(ready=hub.ready, why_not_ready=hub.why_not_ready, registry=registry), *hub.http_routes())
        )
        serve = functools.partial(
            serve_http,
            routes,
            host=http_host,
            port=http_port,
            ssl_context=None if tls is None else tls.context,
            log=log,
            max_connections=cfg.max_http_connections or connection_limits(fd_limit()).http,
            on_error=hub.metrics.connection_errors.labels(transport="http").inc,
            on_refused=hub.metrics.connections_refused.labels(limit="maxHttpConnections").inc,
        )
        tune_gc()
        async with anyio.create_task_group() as tg:
            if tls is not None:
                tg.start_soon(functools.partial(tls.watch, interval=cfg.tls_reload_interval, log=log))
            http_bound = await tg.start(serve)
            edge_tls = None if tls is None else tls.context
            edges_bound = await tg.start(functools.partial(hub.run, host=host, port=port, ssl_context=edge_tls))
            addresses = {"listen": address_text(host, edges_bound), "httpListen": address_text(http_host, http_bound)}
            log.info("hub_listening", listen=addresses["listen"], http_listen=addresses["httpListen"])
            if ports_file is not None:
                write_ports_file(ports_file, addresses)
            try:
                await anyio.sleep_forever()
            finally:
                if ports_file is not None:
                    remove_ports_file(ports_file)
