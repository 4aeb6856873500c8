"""The controller role: owns every node job's and every Diagnosis's lifecycle in the API server.

Selection, initial node entries, job phase, timeouts and Events are decided here by the one
instance holding the leader Lease; the hubs only execute. Under the same Lease it runs the
diagnoses (``roles.controller.diagnosis.diagnoses``): OperationSets' paths, Diagnoses' stages and Tasks; and
approves edge autonomy (``roles.controller.autonomy.controller``): the approval label on the Nodes that ask
for it, and their Pods' tolerations bound to the autonomy duration (in namespaces that opt in, and
at most once per ``autonomyBindingInterval``); and approves the node certificates the hubs ask for on their
devices' behalf (``roles.controller.certificates.approver``, ``nodeCertificates``).
Every instance serves the admission webhooks and its health and metrics endpoints, leader or not,
so admission never depends on the election. ``--feature-gates=disableNodeTaskV1alpha2`` turns the
v1alpha2 node-job controllers off, as in KubeEdge.

Both ports cap their connections, in all and per peer address, and close connections that send no
request head within ``headerTimeout``; the webhook listens on the pod's IP only (:func:`webhook_host`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Final

import anyio
import structlog
from prometheus_client import CollectorRegistry

from flows.certificates.node_requests import Hubs
from nodetask.clock import Clock
from roles.common.config import ControllerConfig, RoleConfig
from roles.common.controller_config import in_pod_namespace
from roles.common.health import health_routes, router, serve_http
from roles.controller.admission.webhook_server import serve_webhooks
from roles.controller.autonomy.controller import AutonomyController
from roles.controller.certificates.approver import CertificateApprover
from roles.controller.diagnosis.diagnoses import DiagnosisController
from roles.controller.leader import Elector, default_identity
from roles.controller.metrics import ControllerMetrics
from roles.controller.nodejobs.reconciler import Reconciler
from roles.kube import open_kube
from schemas.kinds import KINDS

Log = structlog.typing.FilteringBoundLogger

METRICS_MAX_BODY_BYTES: Final = 64 << 10
"""The health and metrics routes are all GETs: a body is never needed."""


async def run(cfg: RoleConfig, *, log: Log, config_path: Path | None = None) -> None:
    """Run the controller until cancelled."""
    assert isinstance(cfg, ControllerConfig)
    cfg = in_pod_namespace(cfg, os.environ)
    kinds = () if "disableNodeTaskV1alpha2" in cfg.feature_gates else KINDS
    if not kinds:
        log.warning("controllers_disabled", gate="disableNodeTaskV1alpha2")
    registry = CollectorRegistry()
    certificates = cfg.node_certificates
    async with open_kube(kubeconfig=cfg.kubeconfig, log=log) as kube:
        elector = Elector(
            kube,
            name=cfg.lease_name,
            namespace=cfg.leader_namespace,
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
            diagnoses = DiagnosisController(
                kube=kube, clock=Clock.start(), log=log, max_targets=cfg.diagnosis_max_targets
            )
            autonomy = AutonomyController(
                kube=kube, clock=Clock.start(), log=log, binding_interval=cfg.autonomy_binding_interval
            )
            with metrics.tracking(reconciler):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(diagnoses.run)
                    tg.start_soon(autonomy.run)
                    if certificates.enabled:
                        users = certificates.hub_user_names(cfg.own_namespace)
                        hubs = Hubs(users=users, groups=frozenset(certificates.hub_groups))
                        approver = CertificateApprover(
                            kube=kube, hubs=hubs, token_namespace=certificates.token_namespace, log=log
                        )
                        tg.start_soon(approver.run)
                    await reconciler.run()
                    tg.cancel_scope.cancel()

        refused = metrics.connections_refused
        async with anyio.create_task_group() as tg:
            routes = list(health_routes(ready=lambda: True, registry=registry))
            if cfg.webhook_port:
                webhooks = functools.partial(
                    serve_webhooks, cfg, kube=kube, registry=registry, refused=refused, log=log
                )
                await tg.start(webhooks)
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
