"""The admission webhooks' HTTPS server: its certificate, followed as its files are rotated, and its registration.

The certificate is the configured files (mounted from a Secret in a cluster) or one generated at
start. Either way :class:`~roles.common.cert_reload.ReloadingCertificate` serves what the files hold once
they change, without a restart. The API server checks the webhook's certificate against the
``caBundle`` registered with the webhook configurations, so when a rotation brings a new CA (as
``nodetaskd certs create --rotate`` does; cert-manager issuers usually keep theirs) the
configurations are registered again with it. Every replica does so once it serves the new
certificate; until a replica's kubelet has brought it the new files, the API server's calls that
reach it fail (the validating webhook's policy is Fail): keeping the CA avoids that window.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, NoReturn
from urllib.parse import urlsplit

import anyio
import anyio.abc
import structlog
from prometheus_client import CollectorRegistry, Counter

from roles.common.cert_reload import ReloadingCertificate
from roles.common.config import ConfigError, ControllerConfig
from roles.common.health import router, serve_http
from roles.common.tls import ServingCertificate, TlsError, generate_serving_certificate, load_serving_certificate
from roles.controller.admission.registration import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
    register_webhooks,
    webhook_configurations,
)
from roles.controller.admission.reviews import admission_policy, admission_routes
from roles.kube import ApiError, Kube

__all__ = ["POD_IP_ENV", "serve_webhooks", "serving_certificate", "webhook_host"]

Log = structlog.typing.FilteringBoundLogger
Configurations = Callable[[bytes], tuple[ValidatingWebhookConfiguration, MutatingWebhookConfiguration]]

POD_IP_ENV: Final = "POD_IP"
"""The environment variable the Deployment fills with the pod's IP (``status.podIP``)."""
BUFFERED_REVIEWS: Final = 4
"""Largest reviews the webhook server holds at once (its request bodies, until answered)."""


def webhook_host(cfg: ControllerConfig, environ: Mapping[str, str]) -> str:
    """Where the webhook listens: ``webhookHost``, else the pod's IP, else ``listenHost`` (outside Kubernetes)."""
    return cfg.webhook_host or environ.get(POD_IP_ENV, "").strip() or cfg.listen_host


def serving_certificate(cfg: ControllerConfig) -> ServingCertificate:
    """The webhook's certificate: the configured files, or a fresh CA and certificate for its URL host.

    Errors: :class:`~roles.common.config.ConfigError` naming the configured file that cannot be used.
    """
    if cfg.tls_cert_file:
        ca = Path(cfg.tls_ca_file) if cfg.tls_ca_file else None
        try:
            return load_serving_certificate(Path(cfg.tls_cert_file), Path(cfg.tls_key_file), ca_file=ca)
        except TlsError as exc:
            raise ConfigError(f"tlsCertFile, tlsKeyFile, tlsCaFile: {exc}") from None
    host = urlsplit(cfg.webhook_url).hostname or "localhost"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return generate_serving_certificate(Path(cfg.cert_dir), dns_names=[host, "localhost"])
    return generate_serving_certificate(
        Path(cfg.cert_dir), dns_names=["localhost"], ip_addresses=sorted({host, "127.0.0.1"})
    )


async def serve_webhooks(
    cfg: ControllerConfig,
    *,
    kube: Kube,
    registry: CollectorRegistry,
    refused: Counter,
    log: Log,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve the admission webhooks on ``cfg.webhook_port`` until cancelled, following the certificate's files.

    With ``webhookUrl`` or ``webhookService`` the configurations are registered before this reports
    ready, and registered again whenever the certificate's CA changes. Connections are capped in all and
    per peer; ``refused`` (labelled by port and limit) counts the ones turned away.

    Errors: :class:`~roles.common.config.ConfigError` for a configured certificate that cannot be used, and
    what binding the port or the first registration raise; nothing once ready.
    """
    certificate = ReloadingCertificate(serving_certificate(cfg))
    webhooks = router(admission_routes(policy=admission_policy(cfg), registry=registry, log=log))
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(certificate.watch, interval=cfg.tls_reload_interval, log=log))
        await tg.start(
            functools.partial(
                serve_http,
                webhooks,
                host=webhook_host(cfg, os.environ),
                port=cfg.webhook_port,
                log=log,
                ssl_context=certificate.context,
                max_body_bytes=cfg.webhook_max_body_bytes,
                max_buffered_bytes=BUFFERED_REVIEWS * cfg.webhook_max_body_bytes,
                max_connections=cfg.webhook_max_connections,
                max_connections_per_peer=cfg.webhook_max_connections_per_peer,
                on_refused=refused.labels(port="webhook", limit="webhookMaxConnections").inc,
                on_refused_per_peer=refused.labels(port="webhook", limit="webhookMaxConnectionsPerPeer").inc,
                header_timeout=cfg.header_timeout,
                idle_timeout=cfg.idle_timeout,
            )
        )
        if cfg.webhook_url or cfg.webhook_service:
            # Every replica registers the same configuration (same address, same shared CA), so
            # registering again is a no-op, whichever replica is last.
            service = cfg.webhook_service_ref if cfg.webhook_service else None

            def configurations(ca_bundle: bytes) -> tuple[ValidatingWebhookConfiguration, MutatingWebhookConfiguration]:
                return webhook_configurations(url_base=cfg.webhook_url, service=service, ca_bundle=ca_bundle)

            registered = certificate.certificate.ca_bundle
            await register_webhooks(kube, *configurations(registered), log=log)
            tg.start_soon(
                functools.partial(
                    _follow_ca,
                    kube,
                    certificate,
                    configurations,
                    registered=registered,
                    interval=cfg.tls_reload_interval,
                    log=log,
                )
            )
        task_status.started()
        await anyio.sleep_forever()
    raise AssertionError("the webhook server's task group ended")  # pragma: no cover - it never does


async def _follow_ca(
    kube: Kube,
    certificate: ReloadingCertificate,
    configurations: Configurations,
    *,
    registered: bytes,
    interval: float,
    log: Log,
) -> NoReturn:
    """Register the webhooks again each time the served certificate comes with another CA than ``registered``.

    A registration the API server does not take is tried again after ``interval``.
    """
    while True:
        await anyio.sleep(interval)
        bundle = certificate.certificate.ca_bundle
        if bundle == registered:
            continue
        try:
            await register_webhooks(kube, *configurations(bundle), log=log)
        except ApiError as exc:
            log.warning("webhook_registration_failed", error=str(exc), retry_in_s=interval)
            continue
        registered = bundle
        log.info("webhook_ca_registered")
