"""The controller's configuration: the Lease, the webhook and metrics ports, admission's bounds.

Loaded with the others by :func:`roles.common.config.load_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Final

import msgspec

from roles.common.config_types import (
    DEFAULT_IMAGE_SECRET_NAMESPACES,
    DEFAULT_TLS_RELOAD_INTERVAL,
    NAMESPACE,
    BaseConfig,
    Port,
    Seconds,
    check_namespaces,
)

__all__ = ["ControllerConfig", "NodeCertificatesConfig"]

FEATURE_GATES: Final = frozenset({"disableNodeTaskV1alpha2"})
POD_NAMESPACE_ENV: Final = "POD_NAMESPACE"
DEFAULT_WEBHOOK_MAX_BODY_BYTES: Final = (3 << 20) + (64 << 10)
"""Two objects of etcd's 1.5 MiB (an UPDATE's object and oldObject) and 64 KiB for the review around them."""


class NodeCertificatesConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The approver of devices' node certificates (``roles.controller.certificates.approver``): which
    CertificateSigningRequests are the hubs', and where the edges' join tokens are.

    It decides only requests for kubelets' client signer created by a hub identity listed here, approving
    one when it is exactly for the node its label names and that node has a join token Secret (an edge node
    of nodetaskd's), denying it otherwise. Off when no identity is listed."""

    hub_users: tuple[str, ...] = ()
    """User names the hubs act as (e.g. ``system:serviceaccount:nodetaskd-system:nodetaskd-cloud``)."""
    hub_service_accounts: tuple[str, ...] = ()
    """``[namespace/]name`` of ServiceAccounts the hubs run as, without a namespace the controller's own
    (``namespace``): the user names ``system:serviceaccount:<namespace>:<name>``, beside ``hubUsers``."""
    hub_groups: tuple[str, ...] = ("nodetaskd:clouds",)
    """Groups whose members act as hubs (containers/rbac binds the cloud role to ``nodetaskd:clouds``). Whoever
    is in one may have certificates of every edge node approved: list only the hubs' own."""
    token_namespace: str = "kube-system"
    """Where the edges' join token Secrets ``nodetaskd-edge-<node>`` are: the hubs' ``tokenNamespace``. The
    controller may read Secrets there (their metadata only is asked for), and nowhere else."""

    def __post_init__(self) -> None:
        if not NAMESPACE.fullmatch(self.token_namespace):
            raise ValueError(f"nodeCertificates.tokenNamespace: {self.token_namespace!r} is not a namespace name")
        for what, names in (("hubUsers", self.hub_users), ("hubGroups", self.hub_groups)):
            if any(not name or name.startswith("system:node") for name in names):
                raise ValueError(f"nodeCertificates.{what}: an empty name, or a node's, cannot be a hub's")
        for account in self.hub_service_accounts:
            if not all(NAMESPACE.fullmatch(part) for part in account.split("/", 1)):
                raise ValueError(f"nodeCertificates.hubServiceAccounts: {account!r} is not [namespace/]name")

    @property
    def enabled(self) -> bool:
        return bool(self.hub_users or self.hub_groups or self.hub_service_accounts)

    def hub_user_names(self, own_namespace: str) -> frozenset[str]:
        """``hubUsers`` and the users of ``hubServiceAccounts`` (those without a namespace in ``own_namespace``)."""
        accounts = (a if "/" in a else f"{own_namespace}/{a}" for a in self.hub_service_accounts)
        return frozenset(self.hub_users) | {f"system:serviceaccount:{a.replace('/', ':')}" for a in accounts}


class ControllerConfig(BaseConfig, frozen=True, kw_only=True):
    kubeconfig: str = ""
    """Path of a kubeconfig; empty means in-cluster configuration."""
    feature_gates: tuple[str, ...] = ()
    namespace: str = ""
    """The namespace this controller runs in. Empty: the pod's own, from the environment variable
    ``POD_NAMESPACE`` (``containers/deploy/controller.yaml`` sets it from the downward API); outside
    Kubernetes, kube-system. The settings below that leave their namespace out mean this one, so that a
    kustomize ``namespace:`` alone moves the install."""
    lease_name: str = "nodetaskd-controller"
    lease_namespace: str = ""
    """Where the leader Lease lives (empty: ``namespace``): the only namespace whose Leases the controller's
    RBAC lets it write (the Role ``nodetaskd:controller:leader-election``, containers/rbac/controller.yaml,
    must be there)."""
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
    """``[namespace/]name[:port]`` of the Service in front of every replica's webhook server (the controller's
    ``namespace`` and port 443 when not given); when set, the controller registers the webhooks with
    ``clientConfig.service`` and the CA of ``tlsCaFile``. It then needs ``tlsCertFile``, ``tlsKeyFile``
    and ``tlsCaFile``: one certificate shared by all replicas (mounted from a Secret), since replicas that
    each generated their own CA would each register theirs and undo the others' registration."""
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
    tolerations (``roles.controller.autonomy.controller``): a change of the annotation within that time is held,
    and the value it has when the time is up is applied. Whoever may patch the Node chooses the
    duration; each change costs a patch of every bound Pod, so this bounds what flapping it costs."""
    diagnosis_max_targets: Annotated[int, msgspec.Meta(ge=1)] = 5000
    """Target nodes a Diagnosis may have: each is a Task per stage. The webhook refuses a Diagnosis
    listing more node names or pod references; one whose selector matches more nodes (or stored while
    the webhook was away) fails with ``TooManyTargets``, creating no Task. (The default is
    ``schemas.diagnosis.v1.DEFAULT_MAX_TARGETS``, written out: the edge's launcher loads this module and
    no API types.)"""

    node_certificates: NodeCertificatesConfig = NodeCertificatesConfig()
    """``nodeCertificates``: approving the node certificates the hubs ask for on their devices' behalf."""

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = set(self.feature_gates) - FEATURE_GATES
        if unknown:
            raise ValueError(f"featureGates: unknown gate(s) {', '.join(sorted(unknown))}")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tlsCertFile and tlsKeyFile must be given together")
        check_namespaces(self.image_secret_namespaces)
        for what, namespace in (("namespace", self.namespace), ("leaseNamespace", self.lease_namespace)):
            if namespace and not NAMESPACE.fullmatch(namespace):
                raise ValueError(f"{what}: {namespace!r} is not a namespace name")
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
        return _service_ref(self.webhook_service, self.own_namespace)

    @property
    def own_namespace(self) -> str:
        """``namespace``, or kube-system when it is empty (``POD_NAMESPACE`` is read at start: see
        :func:`in_pod_namespace`)."""
        return self.namespace or "kube-system"

    @property
    def leader_namespace(self) -> str:
        """Where the leader Lease lives: ``leaseNamespace``, else the controller's own namespace."""
        return self.lease_namespace or self.own_namespace


def in_pod_namespace(cfg: ControllerConfig, environ: Mapping[str, str]) -> ControllerConfig:
    """``cfg`` with ``namespace`` from ``POD_NAMESPACE`` in ``environ`` when the config gives none.

    Errors: ValueError naming the variable when its value is not a namespace name."""
    if cfg.namespace or not (found := environ.get(POD_NAMESPACE_ENV, "").strip()):
        return cfg
    if not NAMESPACE.fullmatch(found):
        raise ValueError(f"{POD_NAMESPACE_ENV} {found!r} is not a namespace name")
    return msgspec.structs.replace(cfg, namespace=found)


def _service_ref(text: str, own_namespace: str = "kube-system") -> tuple[str, str, int]:
    """``[namespace/]name[:port]`` as (namespace, name, port); ValueError naming ``webhookService`` otherwise."""
    ref, _, port = text.partition(":")
    namespace, _, name = ref.rpartition("/")
    namespace = namespace or own_namespace
    if not (NAMESPACE.fullmatch(namespace) and NAMESPACE.fullmatch(name)):
        raise ValueError(f"webhookService {text!r} is not [namespace/]name[:port]")
    if port and not (port.isdigit() and 0 < int(port) <= 65535):
        raise ValueError(f"webhookService {text!r}: port {port!r} is not within 1-65535")
    return namespace, name, int(port or 443)
