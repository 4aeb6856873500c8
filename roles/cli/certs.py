"""``nodetaskd certs create``: the two serving certificates a cluster install mounts, as Secrets.

``containers/deploy/`` mounts ``nodetaskd-webhook-tls`` into every controller replica (the admission
webhooks' certificate, for the Service ``nodetaskd-webhook``, with its CA in ``ca.crt``: the
``caBundle`` every replica registers) and ``nodetaskd-hub-tls`` into every hub (for the names edges
connect to). Each gets a CA of its own, generated here by :func:`roles.common.tls.generate_serving_certificate`
and then dropped (its key is never stored); the hubs' CA is written to a file for the edges'
``--ca-file``. Existing Secrets are kept unless ``rotate``: the pods take up the new certificate
without a restart once the kubelet has updated their mounted Secret (:mod:`roles.common.cert_reload`;
the controller registers the new CA with its webhooks), and the edges need the new CA.

cert-manager Certificates with the same ``secretName`` (and ``ca.crt``) do the same job.
"""

from __future__ import annotations

import base64
import ipaddress
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from roles.common.files import write_atomically
from roles.common.tls import CA_FILE, CERT_FILE, KEY_FILE, generate_serving_certificate
from roles.kube import Conflict, Kube
from roles.kube.resources import SECRETS
from schemas.core import Secret
from schemas.meta import ObjectMeta

__all__ = [
    "HUB_SECRET",
    "HUB_SERVICE",
    "NAMESPACE",
    "WEBHOOK_SECRET",
    "WEBHOOK_SERVICE",
    "CertsCreated",
    "create_certs",
]

NAMESPACE: Final = "nodetaskd-system"
WEBHOOK_SERVICE: Final = "nodetaskd-webhook"
WEBHOOK_SECRET: Final = "nodetaskd-webhook-tls"
HUB_SERVICE: Final = "nodetaskd-cloud"
HUB_SECRET: Final = "nodetaskd-hub-tls"
"""The names ``containers/deploy/`` uses (a unit test holds the two to each other)."""


@dataclass(frozen=True, slots=True)
class CertsCreated:
    written: tuple[str, ...]
    """Secrets created or replaced."""
    kept: tuple[str, ...]
    """Secrets that existed and were left alone (no ``rotate``)."""
    hub_ca: bytes | None
    """The CA of the hubs' certificate (new or kept), if their Secret holds one."""


def _names(hosts: Sequence[str]) -> tuple[list[str], list[str]]:
    dns, ips = [], []
    for host in hosts:
        try:
            ips.append(str(ipaddress.ip_address(host)))
        except ValueError:
            dns.append(host)
    return dns, ips


def _tls_secret(name: str, namespace: str, directory: Path) -> Secret:
    data = {key: base64.b64encode((directory / key).read_bytes()).decode() for key in (CERT_FILE, KEY_FILE, CA_FILE)}
    labels = {"app.kubernetes.io/name": "nodetaskd"}
    return Secret(
        metadata=ObjectMeta(name=name, namespace=namespace, labels=labels), type="kubernetes.io/tls", data=data
    )


async def _put(kube: Kube, secret: Secret, *, rotate: bool) -> bool:
    """Create ``secret``, or replace its data when ``rotate``; whether it was written."""
    namespace = secret.metadata.namespace
    try:
        await kube.create(SECRETS, secret, namespace=namespace)
    except Conflict:
        if not rotate:
            return False
        await kube.merge_patch(SECRETS, secret.metadata.name, {"data": secret.data}, namespace=namespace)
    return True


async def create_certs(
    kube: Kube, *, namespace: str = NAMESPACE, hub_hosts: Sequence[str] = (), rotate: bool = False
) -> CertsCreated:
    """Generate and store the webhook's and the hubs' certificates (see the module's docstring).

    ``hub_hosts`` are the DNS names or IP addresses edges reach the hubs at; the hubs' Service name
    in the cluster is always added.
    """
    webhook_names = [f"{WEBHOOK_SERVICE}.{namespace}.svc", f"{WEBHOOK_SERVICE}.{namespace}.svc.cluster.local"]
    dns, ips = _names(hub_hosts)
    hub_names = [*dns, f"{HUB_SERVICE}.{namespace}.svc", f"{HUB_SERVICE}.{namespace}.svc.cluster.local"]
    written: list[str] = []
    kept: list[str] = []
    hub_ca: bytes | None = None
    with tempfile.TemporaryDirectory(prefix="nodetaskd-certs-") as tmp:
        for secret_name, names, addresses in (
            (WEBHOOK_SECRET, webhook_names, []),
            (HUB_SECRET, hub_names, ips),
        ):
            directory = Path(tmp) / secret_name
            generate_serving_certificate(directory, dns_names=names, ip_addresses=addresses, common_name=secret_name)
            if await _put(kube, _tls_secret(secret_name, namespace, directory), rotate=rotate):
                written.append(f"{namespace}/{secret_name}")
                if secret_name == HUB_SECRET:
                    hub_ca = (directory / CA_FILE).read_bytes()
            else:
                kept.append(f"{namespace}/{secret_name}")
                if secret_name == HUB_SECRET:
                    # The CA of the hubs' certificate in use: what edges joining now need.
                    stored = await kube.get(SECRETS, HUB_SECRET, namespace=namespace)
                    hub_ca = base64.b64decode(stored.data.get(CA_FILE, "")) or None
    return CertsCreated(written=tuple(written), kept=tuple(kept), hub_ca=hub_ca)


def write_ca(path: Path, ca: bytes) -> None:
    """The hubs' CA for the edges (public: 0644)."""
    write_atomically(path, ca, mode=0o644)
