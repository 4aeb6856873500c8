"""What a real node's containerd and kubelet are told: containerd's ``config.toml``, the CNI network,
the KubeletConfiguration and the kubelet's flags.

Everything a node owns lives under its state directory or carries its own name, so that several nodes
run on one machine at once: containerd's root, state, sockets and runc root; the CNI bridge, its /24
and the IPAM records; the kubelet's ports, root directory, certificate directory and cgroup root.
Standard library only, like the other provisioning scripts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tools.provision import node_inspect
from tools.provision.node_images import PAUSE_IMAGE

_DISABLED_PLUGINS: Final = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.overlayfs",
    "io.containerd.snapshotter.v1.zfs",
)
"""Snapshotters that need kernel features or tools a machine may lack; pods use ``native`` (the images are
a few megabytes, copying them costs nothing)."""

NODES_DIR: Final = Path("/var/lib/nodetaskd/nodes")
"""Where the nodes' sockets and kubelet root directories are (one directory each, :attr:`Layout.short_dir`)."""
CNI_BIN_DIR: Final = Path("/usr/lib/cni")
"""Where Debian's containernetworking-plugins puts bridge, host-local, loopback and portmap."""


@dataclass(frozen=True)
class Layout:
    """A node's paths, all under its state directory."""

    state_dir: Path

    @property
    def containerd_dir(self) -> Path:
        return self.state_dir / "containerd"

    @property
    def short_dir(self) -> Path:
        """Where the node's unix sockets are made: containerd's, and the kubelet's under its root directory.

        A unix socket's path holds at most 107 bytes (containerd adds ".ttrpc" to its own, the kubelet
        makes ``pod-resources/<number>`` under its root), and a state directory under pytest-xdist's
        temporary tree leaves too little of them: this directory is named for the state directory instead.
        It is on disk, as a device's ``/var/lib`` is, so a power cut leaves it as it was."""
        digest = hashlib.sha256(str(self.state_dir.expanduser().resolve()).encode()).hexdigest()[:16]
        return NODES_DIR / digest

    @property
    def socket(self) -> Path:
        return self.short_dir / "containerd.sock"

    @property
    def docker_info_socket(self) -> Path:
        """Where the kubelet's cAdvisor finds Docker's answers (:mod:`tools.provision.docker_info`)."""
        return self.short_dir / "docker-info.sock"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.state_dir / "cni" / "conf"

    @property
    def ipam_dir(self) -> Path:
        return self.state_dir / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.short_dir / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.state_dir / "kubelet-config.json"

    @property
    def inspector_dir(self) -> Path:
        """The client CA the kubelet's API trusts, and the harness's certificate (:mod:`node_inspect`)."""
        return self.state_dir / "inspector"

    @property
    def kubelet_cert_dir(self) -> Path:
        return self.state_dir / "kubelet-pki"

    @property
    def private_dir(self) -> Path:
        """Directories mounted over the machine's own in the node's mount namespace (:data:`PRIVATE_DIRS`)."""
        return self.state_dir / "private"

    @property
    def record(self) -> Path:
        return self.state_dir / "node.json"

    def log(self, process: str) -> Path:
        return self.state_dir / f"{process}.log"


PRIVATE_DIRS: Final[Mapping[str, str]] = {
    "/var/log/pods": "var-log-pods",
    "/var/log/containers": "var-log-containers",
    "/var/lib/kubelet/device-plugins": "device-plugins",
    "/var/lib/cni": "var-lib-cni",
}
"""Paths the kubelet 1.20 and containerd's CRI plugin use whatever they are told, each mounted over by a
directory of the node's own (under ``private/``) inside its mount namespace. Shared, they clash: a
kubelet's container garbage collection deletes every pod log directory under /var/log/pods whose pod it
does not know, so a second kubelet would delete the first one's."""

PRIVATE_TMPFS: Final = ("/run/containerd", "/run/netns")
"""The node's ``/run``, as far as its containerd goes: its state, runc's state, the shims' sockets and the
pods' network namespace handles, on a tmpfs of the node's own in its mount namespace, lost at a power
cut as a device's ``/run`` is."""


def _q(value: object) -> str:
    # TOML basic strings are JSON-compatible for these values, so json.dumps quotes them safely.
    return json.dumps(str(value))


def containerd_toml(layout: Layout) -> str:
    """containerd with its CRI plugin for the kubelet: own root, sockets and CNI network; its state (and
    runc's, under it) in the node's private ``/run/containerd``.

    ``restrict_oom_score_adj``: these machines drop CAP_SYS_RESOURCE, so no process may lower an
    ``oom_score_adj``, and the CRI plugin gives sandboxes -998: without it runc fails every sandbox
    with ``can't get final child's PID from pipe: EOF``."""
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    disabled = ", ".join(_q(p) for p in _DISABLED_PLUGINS)
    return "\n".join(
        [
            "version = 2",
            f"root = {_q(layout.containerd_dir / 'root')}",
            'state = "/run/containerd"',  # private to the node (PRIVATE_TMPFS)
            f"disabled_plugins = [{disabled}]",
            "[grpc]",
            f"  address = {_q(layout.socket)}",
            "[ttrpc]",
            f"  address = {_q(str(layout.socket) + '.ttrpc')}",
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {_q(layout.containerd_dir / 'opt')}",
            f"{cri}]",
            f"  sandbox_image = {_q(PAUSE_IMAGE)}",
            "  restrict_oom_score_adj = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            f"{cri}.containerd]",
            '  snapshotter = "native"',
            '  default_runtime_name = "runc"',
            f"{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"{cri}.cni]",
            f"  bin_dir = {_q(CNI_BIN_DIR)}",
            f"  conf_dir = {_q(layout.cni_conf_dir)}",
            "  max_conf_num = 1",
            f"{cri}.registry]",
            f"  config_path = {_q(layout.containerd_dir / 'certs.d')}",
            "",
        ]
    )


@dataclass(frozen=True)
class Network:
    """A node's pod network: a bridge of its own (``ntd<index>``) with a private /24 (``10.233.<index>.0/24``)."""

    index: int

    @property
    def bridge(self) -> str:
        return f"ntd{self.index}"

    @property
    def subnet(self) -> str:
        return f"10.233.{self.index}.0/24"

    @property
    def name(self) -> str:
        return f"nodetaskd-{self.index}"


def cni_conflist(network: Network, layout: Layout) -> str:
    """The bridge (the host is its gateway, so that the host reaches pod IPs) with host-local addresses
    recorded under the node's state directory, then portmap for host ports."""
    conflist = {
        "cniVersion": "0.4.0",
        "name": network.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": network.subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(conflist, indent=2) + "\n"


def kubelet_configuration(
    *, port: int, healthz_port: int, cgroup_root: str, layout: Layout, settings: Mapping[str, object] | None = None
) -> str:
    """A KubeletConfiguration (v1beta1, JSON) for a kubelet sharing the machine with others, with ``settings``
    (its JSON keys) over the defaults below.

    Its API port answers on loopback only and to the harness only: anonymous and webhook authentication are
    off, and the one client CA it trusts is the node's own (:mod:`tools.provision.node_inspect`), so no
    node's credentials reach another node's pods.
    Image garbage collection is off (images cannot be pulled again here) and hard eviction only
    guards against exhaustion (a shared test machine's disk or memory would evict the pods). No
    iptables chains: they are for kube-proxy, which does not run, and a kubelet's would stay in the
    machine's tables (one drops packets from elsewhere to 127.0.0.0/8)."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(node_inspect.client_ca(layout.inspector_dir))},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "20Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "volumePluginDir": str(layout.state_dir / "volume-plugins"),
        **(settings or {}),
    }
    return json.dumps(config, indent=2) + "\n"


def kubelet_flags(
    kubelet: Path, *, name: str, kubeconfig: Path, layout: Layout, labels: Mapping[str, str], extra: Sequence[str]
) -> list[str]:
    argv = [
        str(kubelet),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={kubeconfig}",
        "--container-runtime=remote",
        f"--container-runtime-endpoint=unix://{layout.socket}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_cert_dir}",
        f"--hostname-override={name}",
        f"--pod-infra-container-image={PAUSE_IMAGE}",
        # cAdvisor asks Docker for its root at every start, five seconds long when none answers.
        f"--docker=unix://{layout.docker_info_socket}",
        "--v=1",
    ]
    if labels:
        argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return [*argv, *extra]


__all__ = [
    "CNI_BIN_DIR",
    "PRIVATE_DIRS",
    "PRIVATE_TMPFS",
    "Layout",
    "Network",
    "cni_conflist",
    "containerd_toml",
    "kubelet_configuration",
    "kubelet_flags",
]
