"""What the hub needs from the cloud role's configuration (built from it by :func:`roles.cloud.role.settings_of`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HubSettings"]


@dataclass(frozen=True, slots=True)
class HubSettings:
    """What the hub needs from the cloud role's configuration."""

    hub_id: str
    heartbeat_interval: float = 15.0
    missed_heartbeats: int = 3
    coalesce_window: float = 0.2
    max_frame_bytes: int = 1 << 20
    token_namespace: str = "kube-system"
    image_secret_namespaces: tuple[str, ...] = ("kube-system",)
    """The only namespaces whose Secrets a job's ``imageSecrets`` may name."""
    close_grace: float = 5.0
    hello_timeout: float = 10.0
    handshake_timeout: float = 10.0
    """Seconds from accept for an edge's TLS and websocket handshake; an idle connection is closed after it."""
    max_handshakes: int | None = None
    """Edge connections at once not yet past their token check (None: from RLIMIT_NOFILE, see ingress)."""
    max_sessions: int | None = None
    """Edge connections at once past it (None: from RLIMIT_NOFILE, see ingress)."""
    compact_status_above: int | None = 1000
    """Jobs of more nodes keep a compact status entry per succeeded node (None: never)."""
    mark_pending_limit: float = 120.0
    """A Node mark pending longer than this makes the hub not ready (its API writes are stuck)."""
    cache_streams: bool = True
    """Offer edges ``cache.v1``: their node's objects, the autonomy request, the Autonomy condition."""
    cache_secrets: bool = False
    """Also send the Secrets a node's Pods reference, to edges listing ``cache.secrets`` (needs the
    extra RBAC of ``containers/rbac/cache-secrets``: list and watch of Secrets in every namespace)."""
    cache_fetch_rate: float = 20.0
    """Keys a second one node's ``CacheFetch`` frames may name, after ``cache_fetch_burst`` at once (across
    its sessions); a frame naming more than is left is refused whole with a ``rate_limited`` Error."""
    cache_fetch_burst: int = 1000
    """Keys a node's edge may fetch at once (at least ``MAX_FETCH_KEYS``, so that any frame can pass)."""
    api_relay: tuple[str, int] | None = None
    """Where devices' tunnels go (the API server's host and port, from the hub's kubeconfig); None: no relay."""
    max_tunnels_per_node: int = 64
    """Tunnels one node may hold open through this hub at once."""
    node_ca_bundle: bytes | None = None
    """The CA bundle (PEM) the hub's kubeconfig trusts, sent to devices with their node's certificate; None:
    the hub issues none (``apiRelay.nodeCertificates`` off, or no CA in the kubeconfig)."""
    node_certificate_timeout: float = 60.0
    """Seconds a device's certificate request may take to be approved and signed; then it is refused."""
    autonomy_condition_interval: float = 10.0
    """Seconds between writes of one Node's Autonomy condition (each with its Event, if any): a condition
    sent sooner waits, replaced by any sent after it, so that the latest one is written."""
