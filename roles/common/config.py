"""Role configuration: a YAML file decoded into typed Structs, then overridden by flags.

Each role has its own Struct; unknown keys are errors that name the key, so a misspelt option is
reported at start instead of silently ignored.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, ClassVar, Final

import msgspec

from nodetask import nesting
from nodetask.names import clip, object_name_problem

__all__ = [
    "AutonomyConfig",
    "CloudConfig",
    "ConfigError",
    "ControllerConfig",
    "EdgeConfig",
    "LocalApiConfig",
    "RoleConfig",
    "load_config",
]

_SHA256: Final = re.compile(r"[0-9a-fA-F]{64}")
_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A Kubernetes namespace name (a DNS-1123 label)."""

Seconds = Annotated[float, msgspec.Meta(gt=0)]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
LoopbackPort = Annotated[int, msgspec.Meta(ge=1, le=65535)]

DEFAULT_TLS_RELOAD_INTERVAL: Final = 5.0
"""A rotation is served 5 to 10 seconds after it is on disk, well within the minute or so a kubelet
takes to bring a changed Secret into a pod; a look is a few stat calls."""
FEATURE_GATES: Final = frozenset({"disableNodeTaskV1alpha2"})
DEFAULT_WEBHOOK_MAX_BODY_BYTES: Final = (3 << 20) + (64 << 10)
"""Two objects of etcd's 1.5 MiB (an UPDATE's object and oldObject) and 64 KiB for the review around them."""
DEFAULT_IMAGE_SECRET_NAMESPACES: Final = ("kube-system",)
"""Where registry Secrets for pre-pulls may live by default: the default ``tokenNamespace``, which
only cluster administrators write to. Anyone who may create a job could otherwise have any registry
Secret in the cluster sent to a node of their choice."""


class ConfigError(ValueError):
    """The configuration file or a flag is invalid; the message names the field."""


class _Config(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    log_level: str = "info"
    log_format: str = "console"
    """``console`` for people, ``json`` for log collectors."""

    def __post_init__(self) -> None:
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError(f"logLevel {self.log_level!r} is not one of debug, info, warning, error")
        if self.log_format not in ("console", "json"):
            raise ValueError(f"logFormat {self.log_format!r} is not one of console, json")


class ControllerConfig(_Config, frozen=True, kw_only=True):
    kubeconfig: str = ""
    """Path of a kubeconfig; empty means in-cluster configuration."""
    feature_gates: tuple[str, ...] = ()
    lease_name: str = "nodetaskd-controller"
    lease_namespace: str = "kube-system"
    """Where the leader Lease lives: the only namespace whose Leases the controller's RBAC lets it write
    (the Role ``nodetaskd:controller:leader-election``, containers/rbac/controller.yaml, must be there)."""
    identity: str = ""
    """This instance's name in the leader Lease; empty means host name and process id."""
    lease_duration: Seconds = 15.0
    timeout_sweep_interval: Seconds = 10.0
    listen_host: str = "0.0.0.0"
    """Where the health/metrics endpoint listens, and the webhook too unless ``webhookHost`` or the pod's
    IP says otherwise."""
    webhook_host: str = ""
    """Where the webhook listens. Empty: the pod's own IP, from the environment variable ``POD_IP``
    (``containers/deploy/controller.yaml`` sets it from the downward API), so that the webhook is not
    served on the node's or any other interface of a host-network pod; without ``POD_IP`` (a run
    outside Kubernetes), ``listenHost``."""
    webhook_port: Port = 9443
    """0 turns the admission webhooks off."""
    webhook_max_body_bytes: Annotated[int, msgspec.Meta(ge=64 << 10)] = DEFAULT_WEBHOOK_MAX_BODY_BYTES
    """Largest AdmissionReview taken (413 beyond: the API server then refuses the request, as the
    validating webhook fails closed). An UPDATE's review carries the object twice (object and
    oldObject), and etcd stores objects of up to 1.5 MiB, so the default takes two of those and the
    review around them: a smaller limit would refuse every update of the largest jobs, their
    finalizer's removal included. Request bodies held at once by the webhook server are limited to
    four times this (503 beyond)."""
    webhook_max_connections: Annotated[int, msgspec.Meta(ge=1)] = 256
    """Connections to the webhook port at once; more are closed as soon as they are accepted. Each
    idle TLS connection costs about 40 KiB until the header or idle timeout closes it."""
    webhook_max_connections_per_peer: Annotated[int, msgspec.Meta(ge=1)] = 64
    """Of ``webhookMaxConnections``, how many one address may hold (each API server is one address,
    and opens a connection per admission call under way)."""
    metrics_max_connections: Annotated[int, msgspec.Meta(ge=1)] = 64
    """Connections to the health/metrics port at once; more are closed as soon as they are accepted."""
    metrics_max_connections_per_peer: Annotated[int, msgspec.Meta(ge=1)] = 16
    """Of ``metricsMaxConnections``, how many one address (a kubelet, a Prometheus) may hold."""
    header_timeout: Seconds = 10.0
    """Seconds a new connection to the webhook or metrics port has for its TLS handshake and its first
    request's head; then it is closed."""
    idle_timeout: Seconds = 30.0
    """Seconds a connection to either port may sit between requests, or take to send a whole request."""
    webhook_url: str = ""
    """The HTTPS base URL the API server calls the webhooks at; when set, the controller registers them."""
    webhook_service: str = ""
    """``namespace/name[:port]`` of the Service in front of every replica's webhook server (port 443 when
    not given); when set, the controller registers the webhooks with ``clientConfig.service`` and the CA
    of ``tlsCaFile``. It then needs ``tlsCertFile``, ``tlsKeyFile`` and ``tlsCaFile``: one certificate
    shared by all replicas (mounted from a Secret), since replicas that each generated their own CA
    would each register theirs and undo the others' registration."""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    """The webhook's serving certificate; without one, a CA and certificate are generated in ``certDir``."""
    cert_dir: str = "/var/lib/nodetaskd/controller-tls"
    tls_reload_interval: Seconds = DEFAULT_TLS_RELOAD_INTERVAL
    """Seconds between looks at the webhook's certificate files: once they change (a rotated Secret)
    and hold still for one more look, new connections get the new certificate and, with a new CA in
    ``tlsCaFile``, the webhooks are registered again with it. Files that cannot be used are refused
    with a warning and the certificate served until then is kept."""
    metrics_port: Port = 9090
    image_secret_namespaces: tuple[str, ...] = DEFAULT_IMAGE_SECRET_NAMESPACES
    """Namespaces whose Secrets an ImagePrePullJob's ``imageSecrets`` may name; the webhook refuses any
    other. Keep it equal to the hubs' setting (they refuse the rest too)."""
    autonomy_binding_interval: Seconds = 60.0
    """Seconds between two changes of the binding a Node's autonomy duration imposes on its Pods'
    tolerations (``roles.controller.autonomy``): a change of the annotation within that time is held,
    and the value it has when the time is up is applied. Whoever may patch the Node chooses the
    duration; each change costs a patch of every bound Pod, so this bounds what flapping it costs."""
    diagnosis_max_targets: Annotated[int, msgspec.Meta(ge=1)] = 5000
    """Target nodes a Diagnosis may have: each is a Task per stage. The webhook refuses a Diagnosis
    listing more node names or pod references; one whose selector matches more nodes (or stored while
    the webhook was away) fails with ``TooManyTargets``, creating no Task. (The default is
    ``schemas.diagnosis.v1.DEFAULT_MAX_TARGETS``, written out: the edge's launcher loads this module and
    no API types.)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = set(self.feature_gates) - FEATURE_GATES
        if unknown:
            raise ValueError(f"featureGates: unknown gate(s) {', '.join(sorted(unknown))}")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tlsCertFile and tlsKeyFile must be given together")
        _check_namespaces(self.image_secret_namespaces)
        if self.webhook_url and not self.webhook_url.startswith("https://"):
            raise ValueError(f"webhookUrl {self.webhook_url!r} must be an https:// URL")
        if self.webhook_max_connections_per_peer > self.webhook_max_connections:
            raise ValueError("webhookMaxConnectionsPerPeer must not be more than webhookMaxConnections")
        if self.metrics_max_connections_per_peer > self.metrics_max_connections:
            raise ValueError("metricsMaxConnectionsPerPeer must not be more than metricsMaxConnections")
        if self.webhook_service:
            _service_ref(self.webhook_service)
            if self.webhook_url:
                raise ValueError("webhookUrl and webhookService exclude each other: the webhooks have one address")
            if not (self.tls_cert_file and self.tls_ca_file):
                raise ValueError(
                    "webhookService needs tlsCertFile, tlsKeyFile and tlsCaFile (a certificate shared by every"
                    " replica, e.g. mounted from a Secret): replicas generating their own CA undo each other's"
                    " registration"
                )

    @property
    def webhook_service_ref(self) -> tuple[str, str, int]:
        """``webhookService`` as (namespace, name, port)."""
        return _service_ref(self.webhook_service)


def _service_ref(text: str) -> tuple[str, str, int]:
    """``namespace/name[:port]`` as (namespace, name, port); ValueError naming ``webhookService`` otherwise."""
    ref, _, port = text.partition(":")
    namespace, _, name = ref.partition("/")
    if not (_NAMESPACE.fullmatch(namespace) and _NAMESPACE.fullmatch(name)):
        raise ValueError(f"webhookService {text!r} is not namespace/name[:port]")
    if port and not (port.isdigit() and 0 < int(port) <= 65535):
        raise ValueError(f"webhookService {text!r}: port {port!r} is not within 1-65535")
    return namespace, name, int(port or 443)


class CloudConfig(_Config, frozen=True, kw_only=True):
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

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, value in (("listen", self.listen), ("httpListen", self.http_listen)):
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or int(port) > 65535:
                raise ValueError(f"{key} {value!r} is not host:port")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tlsCertFile and tlsKeyFile must be given together")
        _check_namespaces(self.image_secret_namespaces)

    @property
    def listen_address(self) -> tuple[str, int]:
        return _address(self.listen)

    @property
    def http_address(self) -> tuple[str, int]:
        return _address(self.http_listen)


def _check_namespaces(namespaces: tuple[str, ...]) -> None:
    for namespace in namespaces:
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"imageSecretNamespaces: {namespace!r} is not a namespace name")


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class LocalApiConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The device's local Kubernetes API (``roles.edge.local_api``): the cloud objects its node needs,
    read from the agent's cache, online or offline, by programs on the device and ``kubectl``."""

    enabled: bool = False
    """Off by default: when on, any local process can read what it serves, without credentials."""
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 10261
    """The port on 127.0.0.1 (the only address it listens on); 10261 is where OpenYurt's YurtHub
    serves the same role, so clients set up for one find the other."""
    serve_secrets: bool = False
    """Whether the device keeps its node's Secrets at all (in its store, readable by root only) and the
    local API serves them; off, the hub sends none, any cached before are purged at start, and the
    API refuses them with 403."""
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 100
    """Connections at once (a watch holds one); one more is answered 503 naming this setting and closed."""
    max_connections_per_client: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 25
    """Connections at once from one client, a client being the user owning the connecting socket (on
    loopback every client has the same address): one user's programs leave the rest to the others'."""

    def __post_init__(self) -> None:
        if self.max_connections_per_client > self.max_connections:
            raise ValueError(
                f"localApi.maxConnectionsPerClient ({self.max_connections_per_client}) is more than"
                f" localApi.maxConnections ({self.max_connections})"
            )


class AutonomyConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """Edge autonomy (``roles.edge.autonomy_manager``): the cache's repair of keys it failed to store."""

    repair_period: Seconds = 30.0
    """How often keys the cache failed to store are asked for again while a hub is connected."""


class ScriptsConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """Which diagnosis scripts (an Operation's ``scriptRunner``) this device runs."""

    enabled: bool = False
    """Off by default: whoever may create an Operation must not get a shell on every device."""
    allowed_sha256: tuple[str, ...] = ()
    """With ``enabled``, only scripts whose SHA-256 (hex, of the script's UTF-8 text) is listed run,
    unless ``allowAny``."""
    allow_any: bool = False
    max_output_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 << 10)] = 64 << 10
    """How much of a script's stdout is kept as its result (the rest is read and dropped, and the
    result says so); at most 64 KiB, the most one result value of a Task holds."""

    def __post_init__(self) -> None:
        for digest in self.allowed_sha256:
            if not _SHA256.fullmatch(digest):
                raise ValueError(f"diagnosis.scripts.allowedSha256: {clip(digest)!r} is not a SHA-256 in hex")


class DiagnosisConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """What a diagnosis Task (``diagnosis.kubediag.org``) may make this device do (``roles.edge.processors``)."""

    scripts: ScriptsConfig = ScriptsConfig()
    http_hosts: tuple[str, ...] = ()
    """Hosts (names or IP addresses, spelt as in ``httpServer.address``) besides the device itself that an
    ``httpServer`` processor may POST to, at any port. The device itself (absent address, ``127.0.0.0/8``,
    ``::1``, ``localhost``) may be called only at the ports of ``loopbackPorts`` (KubeDiag allows any);
    any other host is refused unless listed, so that whoever may create an Operation cannot make every
    device send requests into its networks."""

    probe_hosts: tuple[str, ...] = ()
    """Hosts (names or IP addresses) besides the device itself that the ``network.probe`` collector may
    resolve and connect to, at any port. None by default: a name nobody listed is not even resolved,
    so that whoever may create an Operation can neither scan the device's networks nor use its
    resolver as an oracle. Separate from ``httpHosts``: a probe only opens and closes a connection,
    a POST sends a Task's data and takes the answer as its results."""

    loopback_ports: tuple[LoopbackPort, ...] = ()
    """The device's own TCP ports (on ``127.0.0.0/8``, ``::1``, ``localhost``, and ``0.0.0.0``/``::``,
    which reach the device too) that an ``httpServer`` may POST to and ``network.probe`` may connect to.
    None by default: a device's loopback is where etcd, an API server or a hub listen, and a Task
    could otherwise find them or write into them. The agent's own ports (``localApi.port`` when the
    local API is on) are refused even if listed."""

    tail_dirs: tuple[str, ...] = ()
    """Directories under which the ``file.tail`` collector may read files (absolute paths; a file's
    symbolic links are resolved before the check). None by default: a Task may not read the device's
    files unless its owner lists where. Only root should be able to change these directories and
    their parents: whoever can replace one with a link decides what it holds."""

    max_concurrent_tasks: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    """Tasks whose processors run at once on this device; the others wait their turn (holding none of their
    data in memory meanwhile), each for at most its operation's ``timeoutSeconds``, then fail naming this
    setting. Bounds what answers, scripts and collectors in flight take of the device's memory."""
    max_request_bytes: Annotated[int, msgspec.Meta(ge=1 << 10, le=768 << 10)] = 128 << 10
    """The most bytes (as JSON) of a Task's request data this device takes: its parameters, with what
    earlier stages passed on and the names the cloud adds. A Task with more fails naming this setting,
    and nothing of its data is stored. The default takes a Diagnosis's parameters at the controller's
    64 KiB bound and one earlier result at its 64 KiB bound; a hub sends up to 768 KiB."""

    def __post_init__(self) -> None:
        for directory in self.tail_dirs:
            if not directory.startswith("/") or "\x00" in directory:
                raise ValueError(f"diagnosis.tailDirs: {clip(directory)!r} is not an absolute path")
        for key, hosts in (("httpHosts", self.http_hosts), ("probeHosts", self.probe_hosts)):
            for host in hosts:
                if not host or (any(c in host for c in "/ :@") and not _is_ipv6(host)):
                    raise ValueError(f"diagnosis.{key}: {host!r} is not a host name or IP address (no scheme or port)")


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


class EdgeConfig(_Config, frozen=True, kw_only=True):
    UPDATABLE_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {
            "logLevel",
            "logFormat",
            "maxCpuUsage",
            "maxMemUsage",
            "maxDiskUsage",
            "configUpdateHealthDeadline",
            "upgradeHealthDeadline",
        }
    )
    """The settings a ConfigUpdateJob may change: operational ones, each set whole.

    Whoever may create a job must not be able to take an edge from its cloud or make it run their
    code, so identity (nodeName), the hub connection (hubUrls), credentials (tokenFile), TLS
    (caFile), paths (dataDir), the container runtime (criEndpoint) and where code and images come
    from (upgradeImage, insecureRegistries) are never updatable: change them on the device. The
    admission webhook and the agent both refuse any other key (``schemas.update_fields``)."""

    node_name: str = ""
    hub_urls: tuple[str, ...] = ()
    token_file: str = ""
    ca_file: str = ""
    data_dir: str = "/var/lib/nodetaskd"
    cri_endpoint: str = "unix:///run/containerd/containerd.sock"
    max_cpu_usage: Percent = 80.0
    max_mem_usage: Percent = 80.0
    max_disk_usage: Percent = 80.0
    config_update_health_deadline: Seconds = 60.0
    """How long a restarted agent may take to reach a hub with an updated config before it is rolled back."""
    upgrade_image: str = ""
    """Repository of the agent's upgrade artifacts (``{upgradeImage}:{version}``) for NodeUpgradeJobs
    without ``spec.image``; empty means such jobs fail their Check."""
    insecure_registries: tuple[str, ...] = ()
    """Registry hosts (``host[:port]``) reached over plain HTTP; loopback registries always are, others use HTTPS."""
    upgrade_health_deadline: Seconds = 60.0
    """How long a newly installed agent version may take to reach a hub before the launcher rolls it back."""
    local_api: LocalApiConfig = LocalApiConfig()
    """``localApi: {enabled: true, port: 10261}`` serves the device's cached cloud objects on loopback.
    Not updatable by a ConfigUpdateJob: whoever may create jobs must not open it on every device."""
    autonomy: AutonomyConfig = AutonomyConfig()
    """Edge autonomy's settings. Not updatable by a ConfigUpdateJob (nothing in it needs to be)."""

    diagnosis: DiagnosisConfig = DiagnosisConfig()
    """What diagnosis processors may do here; closed by default. Not updatable by a ConfigUpdateJob."""
    store_quota_bytes: Annotated[int, msgspec.Meta(ge=1 << 20)] = 64 << 20
    """Once the agent's store holds this many bytes, new diagnosis Tasks fail naming this setting, and
    nothing of their data is stored; results, reports, the cache and node jobs go on (up to the disk)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.node_name and (problem := object_name_problem(self.node_name)):
            raise ValueError(f"nodeName {clip(self.node_name)!r} is not a Kubernetes node name: {problem}")
        for url in self.hub_urls:
            if not url.startswith(("wss://", "ws://")):
                raise ValueError(f"hubUrls: {url!r} is not a ws:// or wss:// URL")
        # Checked here because the runtime is first reached at the first image pull, long after start.
        socket = self.cri_endpoint.removeprefix("unix://")
        if self.cri_endpoint and not socket.startswith("/"):
            raise ValueError(f"criEndpoint {self.cri_endpoint!r} is not a unix socket (unix:///path or /path)")
        for port in self.served_ports:
            if port in self.diagnosis.loopback_ports:
                raise ValueError(
                    f"diagnosis.loopbackPorts lists {port}, the port of this agent's local API (localApi.port):"
                    " no diagnosis Task may reach the agent's own ports"
                )

    @property
    def served_ports(self) -> tuple[int, ...]:
        """The TCP ports this agent itself listens on, on the device: no diagnosis Task may reach them."""
        return (self.local_api.port,) if self.local_api.enabled else ()


RoleConfig = ControllerConfig | CloudConfig | EdgeConfig

ROLE_CONFIGS: Final[dict[str, type[RoleConfig]]] = {
    "controller": ControllerConfig,
    "cloud": CloudConfig,
    "edge": EdgeConfig,
}


def load_config(role: str, path: Path | None, overrides: dict[str, object]) -> RoleConfig:
    """The role's configuration from ``path`` (YAML, optional) with flag ``overrides`` applied.

    Errors:
        :class:`ConfigError` naming the file and the offending field.
    """
    config_type = ROLE_CONFIGS[role]
    where = str(path) if path else "flags"
    try:
        raw: object = nesting.load_yaml(path.read_bytes()) if path else {}
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except nesting.NestingError as exc:
        raise ConfigError(f"config {path}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a mapping of options, not {type(raw).__name__}")
    merged = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return msgspec.convert(merged, type=config_type)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid {role} config ({where}): {exc}") from None
