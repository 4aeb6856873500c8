"""The cloud hub's configuration: its listeners, TLS, and the bounds on what edges may send and ask.

Loaded with the others by :func:`roles.common.config.load_config`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from roles.common.config_types import (
    DEFAULT_IMAGE_SECRET_NAMESPACES,
    DEFAULT_TLS_RELOAD_INTERVAL,
    BaseConfig,
    Seconds,
    address,
    check_namespaces,
)

__all__ = ["ApiRelayConfig", "CloudConfig"]


class ApiRelayConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """Devices' tunnels to the API server (``roles.cloud.relay``): how a kubelet behind its agent reaches
    the cluster. The hub relays TLS it cannot read, to the API server its own kubeconfig names, so a
    device can do exactly what its node's credentials allow; off unless ``enabled``."""

    enabled: bool = False
    max_tunnels_per_node: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 64
    """Tunnels one node may hold at once through a hub (a kubelet holds about a dozen); more are refused."""
    node_certificates: bool = True
    """With ``enabled``: devices that ask get their node's client certificate (``system:node:<node>``), through
    the cluster's CSR API. The hub creates a CertificateSigningRequest for the device's request (for the
    session's node only), the controller approves it and kube-controller-manager signs it; the key stays on
    the device. Needs create and get of certificatesigningrequests (``containers/rbac/cloud.yaml``) and a CA
    in the hub's kubeconfig (it is sent with the certificate)."""
    certificate_timeout: Seconds = 60.0
    """Seconds a device's certificate request may wait to be approved and signed; then it is refused (the
    device asks again later)."""


class CloudConfig(BaseConfig, frozen=True, kw_only=True):
    kubeconfig: str = ""
    hub_id: str = ""
    """This instance's name, recorded on the Nodes it holds; empty means the host name."""
    listen: str = "0.0.0.0:10004"
    """Where edges connect (websockets). Port 0 binds a free port: give a single address as the host then
    (each address a name resolves to would get its own port), and learn the port from ``portsFile``."""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    """Serving certificate and key (PEM); without them the hub speaks plain ws:// (development only)."""
    tls_reload_interval: Seconds = DEFAULT_TLS_RELOAD_INTERVAL
    """Seconds between looks at ``tlsCertFile`` and ``tlsKeyFile``: once they change (a rotated Secret)
    and hold still for one more look, new connections on both listeners get the new certificate and
    the open ones keep theirs. Files that cannot be used are refused with a warning and the
    certificate served until then is kept."""
    token_namespace: str = "kube-system"
    """Where the edges' token Secrets ``nodetaskd-edge-<node>`` live."""
    image_secret_namespaces: tuple[str, ...] = DEFAULT_IMAGE_SECRET_NAMESPACES
    """The only namespaces whose Secrets the hub reads for an ImagePrePullJob's ``imageSecrets`` (and
    sends to its nodes); a job naming another fails with the reason. Grant the hubs ``get`` on
    Secrets in each (``containers/rbac/cloud.yaml`` does for kube-system)."""
    heartbeat_interval: Seconds = 15.0
    missed_heartbeats: Annotated[int, msgspec.Meta(ge=1)] = 3
    status_coalesce_window: Annotated[float, msgspec.Meta(ge=0)] = 0.2
    max_frame_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 1 << 20
    compact_status_above: Annotated[int, msgspec.Meta(ge=0)] | None = 1000
    """Jobs of more nodes than this keep a compact status entry for each node that succeeded (its last
    action only; for pre-pulls no imageStatus when every image was pulled), so that jobs of several
    thousand nodes stay well inside etcd's object size limit. null: KubeEdge's full entry always."""
    close_grace: Seconds = 5.0
    mark_pending_limit: Seconds = 120.0
    """While a Node mark (the hub and agent-version annotations written as an edge connects) has waited
    longer than this, /readyz answers 503 naming the stuck marks: the hub's API writes are not getting
    through. A connect storm of 10,000 edges drains in about a minute on 2 cores."""
    http_listen: str = "0.0.0.0:10002"
    """Health, readiness, metrics and KubeEdge's report endpoint (TLS when the hub has a certificate).
    Port 0 binds a free port, as for ``listen``."""
    ports_file: str = ""
    """Once the hub listens on both ``listen`` and ``httpListen`` (and serves edges), it writes the ports it
    bound to this file, replacing it whole: ``{"pid": 4242, "listen": "127.0.0.1:43121", "httpListen":
    "127.0.0.1:43122"}``, and removes it when it stops. How a supervisor that starts hubs on port 0 (the demo,
    the tests) learns their ports, with no window in which another process could take one. Empty: none."""
    handshake_timeout: Seconds = 10.0
    """Seconds an edge has from connecting to finish its TLS and websocket handshake; then it is closed."""
    max_handshakes: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Edge connections at once that have not yet shown a valid token; more are closed as soon as they
    are accepted (503 on ws://). null: a quarter of the file limit (RLIMIT_NOFILE) less a tenth kept
    for the hub's own connections (at least 256)."""
    max_sessions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Edge connections at once that have (sessions); more are refused with 503. null: the other three
    quarters of what maxHandshakes is taken from, so an unauthenticated flood never takes their places."""
    max_http_connections: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Connections at once to httpListen; more are closed as soon as they are accepted. null: a quarter
    of the hub's reserve of file descriptors, 16 to 256."""
    cache_streams: bool = True
    """Keep each edge that asks (``cache.v1``) a copy of its node's cloud objects: its Node, its Pods and
    the ConfigMaps they reference, for it to serve offline; tell it whether its node asks for autonomy;
    write the Autonomy condition it reports on its Node. Needs list and watch of Pods and ConfigMaps
    in every namespace (``containers/rbac/cloud.yaml``). false: the hub offers none of it."""
    cache_secrets: bool = False
    """Also send edges that ask (``cache.secrets``) the Secrets their Pods reference. Needs list and watch
    of Secrets in every namespace, which the base RBAC does not grant: add ``containers/deploy/cache-secrets``."""
    cache_fetch_rate: Annotated[float, msgspec.Meta(gt=0)] = 20.0
    """Keys a second one node's edge may ask for again (``CacheFetch``, the edge's repair loop), once
    ``cacheFetchBurst`` is spent; a frame asking for more than is left is refused whole, with an Error
    naming both settings (the edge asks again at its next repair). What is left outlives the session:
    reconnecting does not refill it. Each key of the node's own Node or Pods costs the hub a read of the
    API server; what the hub holds costs none."""
    cache_fetch_burst: Annotated[int, msgspec.Meta(ge=256)] = 1000
    """Keys one node's edge may ask for at once, before ``cacheFetchRate`` applies: ten of an agent's
    repair frames. At least 256, the most keys one frame may name."""
    autonomy_condition_interval: Seconds = 10.0
    """Seconds between writes of one Node's Autonomy condition (an edge's check changes it at most every
    10 s): a condition an edge sends sooner waits, replaced by any it sends meanwhile, and the latest is
    written when the interval is over. Each write costs a read and a patch of the Node, an Event when the
    status changes, and the controller's approval label: an edge flapping its condition costs at most
    that every interval."""

    api_relay: ApiRelayConfig = ApiRelayConfig()
    """``apiRelay: {enabled: true}`` relays devices' tunnels to the API server (a kubelet behind its agent)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, value in (("listen", self.listen), ("httpListen", self.http_listen)):
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or int(port) > 65535:
                raise ValueError(f"{key} {value!r} is not host:port")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tlsCertFile and tlsKeyFile must be given together")
        check_namespaces(self.image_secret_namespaces)

    @property
    def listen_address(self) -> tuple[str, int]:
        return address(self.listen)

    @property
    def http_address(self) -> tuple[str, int]:
        return address(self.http_listen)
