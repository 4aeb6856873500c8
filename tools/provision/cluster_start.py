"""How a local control plane starts: its binaries, certificates, tokens, flags and processes, in order.

The cluster is a real one, as far as nodes go: one CA signs the API server's serving certificate and
every client certificate; requests are authorised by the Node authorizer, then RBAC; NodeRestriction
admission keeps a node's credentials to its own Node and pods; kube-controller-manager runs the
controllers a cluster with real kubelets needs (:data:`CONTROLLERS` says which, and why each; the module
docstring of ``controlplane.py`` lists those left out).

Standard library only, like the scripts that use it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tools import ports
from tools.provision import host, kubebuild, pki
from tools.provision.cluster import (
    APISERVER_READY_TIMEOUT,
    CONTROLLER_MANAGER_READY_TIMEOUT,
    ETCD_READY_TIMEOUT,
    IDENTITIES,
    STATE_FILE,
    Binaries,
    ControlPlane,
)

CONTROLLER_MANAGER_USER: Final = "system:kube-controller-manager"
"""Its client certificate's name: the user Kubernetes' default RBAC gives the controller manager's own role."""

CONTROLLERS: Final[Mapping[str, str]] = {
    "csrsigning": "signs approved CertificateSigningRequests with the cluster CA: how a node gets its certificate",
    "csrapproving": "approves a node's requests for its own client certificate (first one and renewals), "
    "when the requester may ask for one",
    "csrcleaner": "deletes issued or denied requests after an hour, pending ones after a day",
    "nodelifecycle": "marks the Node of a kubelet that stopped reporting Unknown, taints it unreachable, "
    "evicts its pods once their tolerations run out: what a node's autonomy must withstand",
    "serviceaccount": "a default ServiceAccount in each namespace (admission refuses a pod without one)",
    "serviceaccount-token": "each ServiceAccount's token Secret, which its pods mount",
    "garbagecollector": "deletes objects whose owners are gone (a Diagnosis's Tasks, a deleted pod's leftovers)",
    "namespace": "empties a deleted namespace, so that it goes",
    "clusterrole-aggregation": "gives view, edit and admin the rules of the ClusterRoles labelled to aggregate into "
    "them (nodetaskd's user roles)",
}
"""kube-controller-manager's ``--controllers``, each with why it runs."""

_CONTROLLER_ROLES: Final = (
    "certificate-controller",
    "node-controller",
    "service-account-controller",
    "namespace-controller",
    "generic-garbage-collector",
    "clusterrole-aggregation-controller",
)
"""The bootstrap ``system:controller:*`` roles of :data:`CONTROLLERS`. With
``--use-service-account-credentials=false`` every controller acts as the controller manager itself, so
its user gets these roles besides its own."""

_RUNTIME_PACKAGES: Final[Mapping[str, str]] = {
    # executable -> Debian package providing it
    "etcd": "etcd-server",
    "kubectl": "kubernetes-client",
    "openssl": "openssl",
}

_OWNED_NAMES: Final = (
    STATE_FILE,
    "etcd-data",
    "pki",
    "nodes",
    "tokens.csv",
    "sa.key",
    "etcd.log",
    "kube-apiserver.log",
    "kube-controller-manager.log",
    "kube-controller-manager.kubeconfig",
    *(f"{name}.kubeconfig" for name in IDENTITIES),
)


@dataclass(frozen=True)
class NodeMonitor:
    """How kube-controller-manager watches node heartbeats; the defaults are production's."""

    period_s: int = 5
    """How often it looks at every Node's status."""
    grace_period_s: int = 40
    """How long a node may go without reporting before it is marked Unknown (then tainted unreachable)."""
    startup_grace_period_s: int = 60
    """The same for a node that has never reported since it was created."""

    def flags(self) -> list[str]:
        return [
            f"--node-monitor-period={self.period_s}s",
            f"--node-monitor-grace-period={self.grace_period_s}s",
            f"--node-startup-grace-period={self.startup_grace_period_s}s",
        ]


AGENT_ONLY_NODES: Final = NodeMonitor(grace_period_s=3600, startup_grace_period_s=3600)
"""For clusters of agent-only Nodes (the tests', the benchmarks'): an hour without news before a Node is
Unknown. Their Nodes are created Ready with no kubelet to renew them, and a run past production's 40 s
would otherwise find them NotReady (and refused jobs) for no reason of its own. Real kubelets renew
theirs; the demo, whose devices' Nodes are to go NotReady, keeps production's grace."""


def ensure_binaries() -> Binaries:
    """etcd, kubectl (Debian packages) and kube-apiserver, kube-controller-manager (built from Debian's
    source, with every other missing product of :mod:`tools.provision.kubebuild`), installed or built
    if missing. The fast path (everything present) takes milliseconds and no lock."""
    found = host.ensure_executables(_RUNTIME_PACKAGES)
    built = kubebuild.ensure_built(("kube-apiserver", "kube-controller-manager"))
    return Binaries(
        etcd=found["etcd"],
        kube_apiserver=built["kube-apiserver"],
        kubectl=found["kubectl"],
        kube_controller_manager=built["kube-controller-manager"],
    )


def prepare_state_dir(state_dir: Path) -> None:
    """Create ``state_dir`` or clear a previous (stopped) run out of it.

    Only entries this module creates are removed, and only when our state
    record is present: pointing NODETASKD_CLUSTER_DIR at a populated
    directory by mistake must not delete anything."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    entries = {p.name for p in state_dir.iterdir()}
    if not entries:
        return
    if STATE_FILE not in entries:
        raise host.ControlPlaneError(f"refusing to use non-empty directory {state_dir} (no {STATE_FILE} in it)")
    previous = ControlPlane.load(state_dir)
    if any(previous.processes_alive().values()):
        raise host.ControlPlaneError(f"a control plane is still running from {state_dir}; stop it first")
    for name in _OWNED_NAMES:
        path = state_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _controller_manager_rbac() -> str:
    """ClusterRoleBindings of the controller manager's user to :data:`_CONTROLLER_ROLES` (a List)."""
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"nodetaskd:kube-controller-manager:{role}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"system:controller:{role}",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": CONTROLLER_MANAGER_USER}],
        }
        for role in _CONTROLLER_ROLES
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": bindings})


def start(
    state_dir: Path,
    binaries: Binaries | None = None,
    *,
    ready_timeout: float = APISERVER_READY_TIMEOUT,
    detach: bool = False,
    node_monitor: NodeMonitor = NodeMonitor(),
) -> ControlPlane:
    """Start etcd, kube-apiserver and kube-controller-manager with state in ``state_dir``; return once
    the apiserver's ``/readyz`` answers 200 for the admin identity and the controller manager's
    ``/healthz`` answers 200.

    Ports are picked fresh; the CA, certificates, tokens and the service-account key are generated
    per start. On any failure everything started so far is stopped again.
    With ``detach=False`` (tests) the kernel also terminates the processes if
    the calling process dies without running :meth:`ControlPlane.stop`;
    ``detach=True`` (the CLI's ``up``) lets them outlive the caller.
    """
    binaries = binaries or ensure_binaries()
    state_dir = state_dir.expanduser().resolve()
    prepare_state_dir(state_dir)

    etcd_port, peer_port, api_port, kcm_port = ports.free_ports(4)
    pki_dir = state_dir / "pki"
    pki_dir.mkdir(mode=0o700)
    ca = pki.make_ca(pki_dir)
    serving = pki.issue(
        ca,
        pki_dir,
        "apiserver",
        common_name="kube-apiserver",
        dns_names=pki.APISERVER_NAMES,
        ip_addresses=(ports.LOOPBACK, "10.0.0.1"),  # 10.0.0.1: the kubernetes Service in the service range
        server=True,
    )
    # What the apiserver shows a kubelet when it proxies logs, exec or port-forward to it.
    kubelet_client = pki.issue(
        ca,
        pki_dir,
        "apiserver-kubelet-client",
        common_name="kube-apiserver-kubelet-client",
        organizations=("system:masters",),
    )
    kcm_client = pki.issue(ca, pki_dir, "kube-controller-manager", common_name=CONTROLLER_MANAGER_USER)
    (pki_dir / "kube-controller-manager").mkdir(mode=0o700)

    sa_key = state_dir / "sa.key"
    host.run_quiet(["openssl", "genrsa", "-out", str(sa_key), "2048"], what="openssl genrsa")
    sa_key.chmod(0o600)

    tokens = {name: secrets.token_urlsafe(32) for name in IDENTITIES}
    token_lines = [
        f'{tokens[name]},{ident.user},{ident.user},"{",".join(ident.groups)}"\n' for name, ident in IDENTITIES.items()
    ]
    token_file = state_dir / "tokens.csv"
    host.write_atomic(token_file, "".join(token_lines), mode=0o600)

    etcd_url = f"http://127.0.0.1:{etcd_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    etcd_args = [
        str(binaries.etcd),
        "--name=nodetaskd",
        f"--data-dir={state_dir / 'etcd-data'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=nodetaskd={peer_url}",
        "--initial-cluster-state=new",
        "--log-level=warn",
        "--logger=zap",
    ]
    apiserver_args = [
        str(binaries.kube_apiserver),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={api_port}",
        "--insecure-port=0",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        f"--client-ca-file={ca.cert}",
        f"--kubelet-client-certificate={kubelet_client.cert}",
        f"--kubelet-client-key={kubelet_client.key}",
        f"--token-auth-file={token_file}",
        "--authorization-mode=Node,RBAC",
        # Added to the default plugins (NamespaceLifecycle, ServiceAccount, DefaultTolerationSeconds, ...).
        "--enable-admission-plugins=NodeRestriction",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={sa_key}",
        f"--service-account-signing-key-file={sa_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        # Service-based webhooks and APIs are called at their Endpoints' addresses: nothing routes ClusterIPs here.
        "--enable-aggregator-routing=true",
        "--profiling=false",
        "--v=1",
    ]
    kcm_kubeconfig = state_dir / "kube-controller-manager.kubeconfig"
    controller_manager_args = [
        str(binaries.kube_controller_manager),
        f"--kubeconfig={kcm_kubeconfig}",
        # Its HTTPS port serves /healthz to anyone and nothing else to anybody: no authentication or
        # authorization kubeconfig (whose requestheader CA this API server does not have).
        "--bind-address=127.0.0.1",
        f"--secure-port={kcm_port}",
        "--port=0",  # no insecure port: several control planes share a machine
        f"--cert-dir={pki_dir / 'kube-controller-manager'}",
        "--leader-elect=false",
        f"--controllers={','.join(CONTROLLERS)}",
        "--use-service-account-credentials=false",
        f"--cluster-signing-cert-file={ca.cert}",
        f"--cluster-signing-key-file={ca.key}",
        f"--service-account-private-key-file={sa_key}",
        f"--root-ca-file={ca.cert}",
        *node_monitor.flags(),
        "--profiling=false",
        "--v=1",
    ]
    cp = ControlPlane(
        state_dir=state_dir,
        server=f"https://127.0.0.1:{api_port}",
        etcd_url=etcd_url,
        ca_file=ca.cert,
        ca_key_file=ca.key,
        kubeconfigs={name: state_dir / f"{name}.kubeconfig" for name in IDENTITIES},
        tokens=tokens,
        pids={},
        logs={name: state_dir / f"{name}.log" for name in ("etcd", "kube-apiserver", "kube-controller-manager")},
        binaries=binaries,
        apiserver_args=apiserver_args,
        controller_manager_args=controller_manager_args,
        controller_manager_health=f"https://127.0.0.1:{kcm_port}/healthz",
        detached=detach,
    )
    try:
        cp._spawn("etcd", etcd_args)
        cp._save()
        cp._wait_etcd_ready(ETCD_READY_TIMEOUT)
        cp._spawn("kube-apiserver", apiserver_args)
        cp._save()
        cp._wait_apiserver_ready(ready_timeout)
        ca_pem = ca.cert.read_bytes()
        for name, ident in IDENTITIES.items():
            config = pki.token_kubeconfig(cp.server, ca_pem, ident.user, tokens[name])
            host.write_atomic(cp.kubeconfigs[name], config, mode=0o600)
        kcm_config = pki.cert_kubeconfig(cp.server, ca_pem, CONTROLLER_MANAGER_USER, kcm_client)
        host.write_atomic(kcm_kubeconfig, kcm_config, mode=0o600)
        cp.kubectl("apply", "-f", "-", input=_controller_manager_rbac())
        cp._spawn("kube-controller-manager", controller_manager_args)
        cp._save()
        cp._wait_controller_manager_ready(CONTROLLER_MANAGER_READY_TIMEOUT)
    except BaseException:
        with contextlib.suppress(host.ControlPlaneError):
            cp.stop()
        raise
    return cp


__all__ = [
    "AGENT_ONLY_NODES",
    "CONTROLLERS",
    "CONTROLLER_MANAGER_USER",
    "NodeMonitor",
    "ensure_binaries",
    "prepare_state_dir",
    "start",
]
