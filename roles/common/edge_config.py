"""The edge agent's configuration: its node and hubs, usage thresholds, and what its local API,
autonomy and diagnosis processors may do (each closed by default).

It needs only the base install: the launcher loads it on the device. Loaded with the others by
:func:`roles.common.config.load_config`.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from typing import Annotated, ClassVar, Final

import msgspec

from nodetask.names import clip, object_name_problem
from roles.common.config_types import BaseConfig, LoopbackPort, Percent, Seconds

__all__ = ["AutonomyConfig", "DiagnosisConfig", "EdgeConfig", "KubeletConfig", "LocalApiConfig", "ScriptsConfig"]

_SHA256: Final = re.compile(r"[0-9a-fA-F]{64}")


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


class MetricsConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The agent's own ``/healthz`` and ``/metrics`` (``roles.edge.metrics``), for the device's monitoring."""

    enabled: bool = False
    """Off by default: when on, any local process can read the agent's counts (no names, no secrets)."""
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 10263
    """The port on 127.0.0.1 (the only address it listens on)."""


class NodeApiConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The API endpoint for the device's node components (``roles.edge.node_api``): the server a kubelet's
    kubeconfig names. Online it relays every request to the API server as the node (the hub must relay:
    its ``apiRelay.enabled``); offline it answers from the cache as OpenYurt's YurtHub does."""

    enabled: bool = False
    """Off by default: when on, any local process can act as the node through it (as through YurtHub).
    The device then keeps its node's Secrets (its pods' volumes need them offline)."""
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 10262
    """The port on 127.0.0.1 (the only address it listens on)."""
    credentials_dir: str = ""
    """Where the node's client certificate (``node.crt``, ``node.key``) and the cluster's CA (``ca.crt``)
    are; empty: ``<dataDir>/node-credentials``."""
    server_name: str = "kubernetes.default.svc"
    """The name the API server's certificate must carry."""


class KubeletConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The node's kubelet, for NodeUpgradeJobs and ConfigUpdateJobs with ``component: kubelet`` (roles.edge.kubelet).

    Off by default (no ``binary``): a job that names the kubelet then fails its Check naming this setting.
    Not updatable by a ConfigUpdateJob: whoever may create jobs must not choose what the device runs as root."""

    binary: str = ""
    """The kubelet's executable, as its supervisor starts it (absolute). An upgrade replaces it whole (a
    rename in its directory), after keeping the running one under ``<dataDir>/kubelet/backup``."""
    restart_command: tuple[str, ...] = ()
    """The command (argv, no shell) that restarts the kubelet under its supervisor, e.g.
    ``[systemctl, restart, kubelet]``; required with ``binary``."""
    healthz_url: str = "http://127.0.0.1:10248/healthz"
    """The kubelet's health endpoint (its ``healthzBindAddress`` and ``healthzPort``), on this device."""
    health_deadline: Seconds = 120.0
    """How long a restarted kubelet may take to answer ``healthz`` and post its Node Ready (with the version
    the upgrade installed) before the upgrade is rolled back."""
    upgrade_image: str = ""
    """The repository of kubelet artifacts (``{upgradeImage}:{version}``), the only one kubelet upgrades take
    from (a job's ``spec.image`` may only repeat it); empty: they fail their Check naming this setting."""
    config_file: str = ""
    """The kubelet's KubeletConfiguration file (its ``--config``, absolute), which ConfigUpdateJobs with
    ``component: kubelet`` edit; empty: they fail their Check naming this setting."""

    def __post_init__(self) -> None:
        if self.binary and not self.binary.startswith("/"):
            raise ValueError(f"kubelet.binary {clip(self.binary)!r} is not an absolute path")
        if self.config_file and not self.config_file.startswith("/"):
            raise ValueError(f"kubelet.configFile {clip(self.config_file)!r} is not an absolute path")
        if self.binary and not self.restart_command:
            raise ValueError("kubelet.restartCommand is empty: say how the kubelet's supervisor restarts it")
        if not self.healthz_url.startswith(("http://", "https://")):
            raise ValueError(f"kubelet.healthzUrl {clip(self.healthz_url)!r} is not an http(s) URL")

    @property
    def enabled(self) -> bool:
        return bool(self.binary)


class AutonomyConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """Edge autonomy (``roles.edge.cache.autonomy_manager``): the check of the Autonomy condition and the cache's
    repair of keys it failed to store."""

    check_period: Annotated[float, msgspec.Meta(ge=1, le=300)] = 10.0
    """How often, in seconds, the Autonomy condition is checked (connected or not). It turns Unknown on the
    fourth check in a row that finds keys the cache failed to store, so this sets how long a failing cache
    goes unreported (about three periods) and how soon a repaired one is True again. 10 s is OpenYurt's
    (its kubelet's node status period)."""
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


class EdgeConfig(BaseConfig, frozen=True, kw_only=True):
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
    reconnect_max_delay: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 30.0
    """The longest wait, in seconds, between two attempts to reach a hub. The waits double from half a second
    up to it (each drawn from its upper half), so after an outage an edge is back within about this long; a
    large fleet spreads its reconnections with a larger one. Not updatable by a ConfigUpdateJob, like the
    rest of the hub connection."""
    handshake_timeout: Annotated[float, msgspec.Meta(ge=1, le=600)] = 30.0
    """How long, in seconds, one attempt to reach a hub may take: TCP, TLS and websocket handshakes together
    (KubeEdge's ``handshakeTimeout``, 30 s too). A hub that dies after the kernel accepted the connection
    never answers it, and the edge tries its next hub only once this is over. Not updatable by a
    ConfigUpdateJob."""
    local_api: LocalApiConfig = LocalApiConfig()
    """``localApi: {enabled: true, port: 10261}`` serves the device's cached cloud objects on loopback.
    Not updatable by a ConfigUpdateJob: whoever may create jobs must not open it on every device."""
    node_api: NodeApiConfig = NodeApiConfig()
    """``nodeApi: {enabled: true}`` serves the node's kubelet its API server on loopback. Not updatable by a
    ConfigUpdateJob: whoever may create jobs must not open it on every device."""
    metrics: MetricsConfig = MetricsConfig()
    """``metrics: {enabled: true, port: 10263}`` serves the agent's health and Prometheus metrics on loopback.
    Not updatable by a ConfigUpdateJob, like the other listeners."""
    autonomy: AutonomyConfig = AutonomyConfig()
    """Edge autonomy's settings. Not updatable by a ConfigUpdateJob (nothing in it needs to be)."""
    kubelet: KubeletConfig = KubeletConfig()
    """The node's kubelet, which NodeUpgradeJobs may upgrade once ``kubelet.binary`` is set; off by default."""

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
        listeners = self._listeners
        for (one, port), (other, same) in itertools.combinations(listeners, 2):
            if port == same:
                raise ValueError(f"{one}.port and {other}.port are both {port}: give each its own")
        for port in self.served_ports:
            if port in self.diagnosis.loopback_ports:
                names = ", ".join(f"{name}.port" for name, _ in listeners)
                raise ValueError(
                    f"diagnosis.loopbackPorts lists {port}, a port of this agent's ({names}):"
                    " no diagnosis Task may reach the agent's own ports"
                )

    @property
    def _listeners(self) -> tuple[tuple[str, int], ...]:
        on = (("localApi", self.local_api), ("nodeApi", self.node_api), ("metrics", self.metrics))
        return tuple((name, block.port) for name, block in on if block.enabled)

    @property
    def served_ports(self) -> tuple[int, ...]:
        """The TCP ports this agent itself listens on, on the device: no diagnosis Task may reach them."""
        return tuple(port for _, port in self._listeners)
