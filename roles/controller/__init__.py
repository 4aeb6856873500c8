"""The controller role: owns every node job's and every Diagnosis's lifecycle in the API server.

Selection, initial node entries, job phase, timeouts and Events are decided here by the one
instance holding the leader Lease; the hubs only execute. Under the same Lease it runs the
diagnoses (``roles.controller.diagnoses``): OperationSets' paths, Diagnoses' stages and Tasks; and
approves edge autonomy (``roles.controller.autonomy``): the approval label on the Nodes that ask
for it, and their Pods' tolerations bound to the autonomy duration.
Every instance serves the admission webhooks and its health and metrics endpoints, leader or not,
so admission never depends on the election. ``--feature-gates=disableNodeTaskV1alpha2`` turns the
v1alpha2 node-job controllers off, as in KubeEdge.

Both ports cap their connections, in all and per peer address, and close connections that send no
request head within ``headerTimeout``; the webhook listens on the pod's IP only (:func:`webhook_host`).
"""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import anyio
import structlog
from prometheus_client import CollectorRegistry

from nodetask.clock import Clock
from roles.config import ControllerConfig, RoleConfig
from roles.controller.admission import admission_policy, admission_routes, register_webhooks, webhook_configurations
from roles.controller.autonomy import AutonomyController
from roles.controller.diagnoses import DiagnosisController
from roles.controller.leader import Elector, default_identity
from roles.controller.metrics import ControllerMetrics
from roles.controller.reconciler import Reconciler
from roles.http import health_routes, router, serve_http
from roles.kube import open_kube
from roles.tls import ServingCertificate, generate_serving_certificate, load_serving_certificate, server_ssl_context
from schemas.kinds import KINDS

Log = structlog.typing.FilteringBoundLogger

POD_IP_ENV: Final = "POD_IP"
"""The environment variable the Deployment fills with the pod's IP (``status.podIP``)."""
BUFFERED_REVIEWS: Final = 4
"""Largest reviews the webhook server holds at once (its request bodies, until answered)."""
METRICS_MAX_BODY_BYTES: Final = 64 << 10
"""The health and metrics routes are all GETs: a body is never needed."""


def webhook_host(cfg: ControllerConfig, environ: Mapping[str, str]) -> str:
    """Where the webhook listens: ``webhookHost``, else the pod's IP, else ``listenHost`` (outside Kubernetes)."""
    return cfg.webhook_host or environ.get(POD_IP_ENV, "").strip() or cfg.listen_host


def serving_certificate(cfg: ControllerConfig) -> ServingCertificate:
    """The webhook's certificate: the configured files, or a fresh CA and certificate for its URL host."""
    if cfg.tls_cert_file:
        ca = Path(cfg.tls_ca_file) if cfg.tls_ca_file else None
        return load_serving_certificate(Path(cfg.tls_cert_file), Path(cfg.tls_key_file), ca_file=ca)
    host = urlsplit(cfg.webhook_url).hostname or "localhost"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return generate_serving_certificate(Path(cfg.cert_dir), dns_names=[host, "localhost"])
    return generate_serving_certificate(
        Path(cfg.cert_dir), dns_names=["localhost"], ip_addresses=sorted({host, "127.0.0.1"})
    )


async def run(cfg: RoleConfig, *, log: Log, config_path: Path | None = None) -> None:
    """Run the controller until cancelled."""
    assert isinstance(cfg, ControllerConfig)
    kinds = () if "disableNodeTaskV1alpha2" in cfg.feature_gates else KINDS
    if not kinds:
        log.warning("controllers_disabled", gate="disableNodeTaskV1alpha2")
    registry = CollectorRegistry()
    async with open_kube(kubeconfig=cfg.kubeconfig, log=log) as kube:
        elector = Elector(
            kube,
            name=cfg.lease_name,
            namespace=cfg.lease_namespace,
            identity=cfg.identity or default_identity(),
            duration=cfg.lease_duration,
            log=log,
        )
        metrics = ControllerMetrics(registry, kube=kube, leader=elector)

        async def reconcile() -> None:
            # A fresh reconciler per term: a lost term's cache may be stale.
            reconciler = Reconciler(
                kube=kube, clock=Clock.start(), log=log, kinds=kinds, on_reconciled=metrics.observe_reconcile
            )
            diagnoses = DiagnosisController(kube=kube, clock=Clock.start(), log=log)
            autonomy = AutonomyController(kube=kube, clock=Clock.start(), log=log)
            with metrics.tracking(reconciler):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(diagnoses.run)
                    tg.start_soon(autonomy.run)
                    await reconciler.run()
                    tg.cancel_scope.cancel()

        refused = metrics.connections_refused
        async with anyio.create_task_group() as tg:
            routes = list(health_routes(ready=lambda: True, registry=registry))
            if cfg.webhook_port:
                cert = serving_certificate(cfg)
                webhooks = router(admission_routes(policy=admission_policy(cfg), registry=registry, log=log))
                serve = functools.partial(
                    serve_http,
                    webhooks,
                    host=webhook_host(cfg, os.environ),
                    port=cfg.webhook_port,
                    log=log,
                    ssl_context=server_ssl_context(cert),
                    max_body_bytes=cfg.webhook_max_body_bytes,
                    max_buffered_bytes=BUFFERED_REVIEWS * cfg.webhook_max_body_bytes,
                    max_connections=cfg.webhook_max_connections,
                    max_connections_per_peer=cfg.webhook_max_connections_per_peer,
                    on_refused=refused.labels(port="webhook", limit="webhookMaxConnections").inc,
                    on_refused_per_peer=refused.labels(port="webhook", limit="webhookMaxConnectionsPerPeer").inc,
                    header_timeout=cfg.header_timeout,
                    idle_timeout=cfg.idle_timeout,
                )
                await tg.start(serve)
                if cfg.webhook_url or cfg.webhook_service:
                    # Every replica registers the same configuration (same address, same shared CA), so
                    # registering again is a no-op, whichever replica is last.
                    validating, mutating = webhook_configurations(
                        url_base=cfg.webhook_url,
                        service=cfg.webhook_service_ref if cfg.webhook_service else None,
                        ca_bundle=cert.ca_bundle,
                    )
                    await register_webhooks(kube, validating, mutating, log=log)
            await tg.start(
                functools.partial(
                    serve_http,
                    router(routes),
                    host=cfg.listen_host,
                    port=cfg.metrics_port,
                    log=log,
                    max_body_bytes=METRICS_MAX_BODY_BYTES,
                    max_connections=cfg.metrics_max_connections,
                    max_connections_per_peer=cfg.metrics_max_connections_per_peer,
                    on_refused=refused.labels(port="metrics", limit="metricsMaxConnections").inc,
                    on_refused_per_peer=refused.labels(port="metrics", limit="metricsMaxConnectionsPerPeer").inc,
                    header_timeout=cfg.header_timeout,
                    idle_timeout=cfg.idle_timeout,
                )
            )
            log.info("controller_serving", webhook_port=cfg.webhook_port, metrics_port=cfg.metrics_port)
            await elector.lead(reconcile)
            tg.cancel_scope.cancel()
