"""A real Kubernetes node on this machine, as a device: a containerd of its own and a stock kubelet 1.20.2.

The kubelet talks to whatever its kubeconfig names: the local kube-apiserver with a node certificate
(:meth:`tools.provision.cluster.ControlPlane.node_kubeconfig`), or a device's plain-HTTP loopback
endpoint with no credentials (:func:`tools.provision.pki.plain_kubeconfig`). It runs pods through its
containerd, whose CRI plugin makes sandboxes of :data:`node_images.PAUSE_IMAGE` and whose CNI bridge
gives them addresses the machine reaches (both images are imported at the first start; nothing is
pulled). Several nodes run on one machine at once: each has its own ports, directories, cgroup root,
bridge and /24 (:mod:`tools.provision.node_config`), and its containerd and kubelet run in a mount
namespace of the node's own (:mod:`tools.provision.node_host`), which is what a device is here (beside them
:mod:`tools.provision.docker_info` answers the kubelet's one question to Docker, which this machine lacks):

- :meth:`Node.restart_device` is a power cut and a boot: every process of the node (kubelet,
  containerd, shims, the pods' containers) is killed, their mounts go with the namespace, and
  containerd and the kubelet start again on the same directories. Only a pod list the kubelet reads
  brings the containers back;
- :meth:`Node.restart_kubelet` restarts the kubelet alone (the containers keep running);
- :meth:`Node.stop` ends everything the node started and gives back its bridge, network and cgroups.

Needs root (cgroups, mounts, bridges). Standard library only, like the other provisioning scripts.
``tools/provision/node.py`` is the command line, and the names to import.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tools import ports
from tools.provision import children, host, node_config, node_host, node_images, node_inspect
from tools.provision.node_config import Layout, Network

CONTAINERD_READY_TIMEOUT: Final = 30.0
KUBELET_READY_TIMEOUT: Final = 60.0
DOCKER_INFO: Final = Path(__file__).with_name("docker_info.py")
_NODE_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def kubelet_restart_command(state_dir: Path) -> list[str]:
    """What restarts the supervised kubelet of the node in ``state_dir`` (``node.py restart-kubelet``), as
    ``systemctl restart kubelet`` does on a device: what an agent's ``kubelet.restartCommand`` names."""
    return [sys.executable, str(Path(__file__).with_name("node.py")), "restart-kubelet", str(state_dir)]


@dataclass
class Node:
    """A running node: its containerd and kubelet, by PID, and everything they were given."""

    name: str
    layout: Layout
    kubeconfig: Path
    tools: node_host.NodeTools
    network: Network
    cgroup_root: str
    kubelet_port: int
    healthz_port: int
    labels: dict[str, str]
    kubelet_args: list[str]
    detached: bool = False
    supervised: bool = False
    """The kubelet runs its own copy of the binary under ``supervise.py``, as a device's systemd runs it."""
    pids: dict[str, int] = field(default_factory=dict)
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False, compare=False)
    _reaper: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def state_dir(self) -> Path:
        return self.layout.state_dir

    @property
    def endpoint(self) -> str:
        """The CRI endpoint of the node's containerd."""
        return f"unix://{self.layout.socket}"

    @property
    def kubelet_binary(self) -> Path:
        """The executable the kubelet is started from: the node's own copy when :attr:`supervised`."""
        return self.state_dir / "kubelet" if self.supervised else self.tools.kubelet

    @property
    def kubelet_restart_command(self) -> list[str]:
        return kubelet_restart_command(self.state_dir)

    @property
    def healthz_url(self) -> str:
        return f"http://127.0.0.1:{self.healthz_port}/healthz"

    def log(self, process: str) -> Path:
        """``containerd.log`` or ``kubelet.log`` in the state directory (every start appends)."""
        return self.layout.log(process)

    def healthz(self) -> tuple[int, str]:
        """The kubelet's ``/healthz`` status and text now; (0, why) when it does not answer."""
        try:
            with urllib.request.urlopen(self.healthz_url, timeout=2) as answer:
                return int(answer.status), answer.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)

    def processes_alive(self) -> dict[str, bool]:
        """Whether containerd and the kubelet are running."""
        return {name: self._alive(name) for name in ("containerd", "kubelet")}

    def images(self) -> set[str]:
        """The image references the node's containerd holds (CRI namespace ``k8s.io``), digests included."""
        return node_host.ctr_images(self.tools.ctr, self.layout.socket)

    def tasks(self) -> dict[str, int]:
        """The containers running in the node's containerd now (CRI namespace ``k8s.io``): container ID to
        the PID of its first process. Sandboxes included."""
        return node_host.ctr_tasks(self.tools.ctr, self.layout.socket)

    # -- operations ------------------------------------------------------------------------------

    def power_on(self, *, kubelet: bool = True) -> None:
        """Start containerd (in a new mount namespace of the node's own) and, unless told not to, the
        kubelet; return once containerd serves and the kubelet's ``/healthz`` is ok."""
        node_host.make_cgroup_root(self.cgroup_root)
        self.layout.short_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        binds = {target: self.layout.private_dir / name for target, name in node_config.PRIVATE_DIRS.items()}
        argv = [str(self.tools.containerd), "--config", str(self.layout.containerd_config)]
        argv = node_host.in_private_mounts(
            argv, unshare=self.tools.unshare, binds=binds, tmpfs=node_config.PRIVATE_TMPFS
        )
        answers = self.layout.docker_info_socket
        answers.unlink(missing_ok=True)  # a power cut leaves it: only the new one's socket says it listens
        self._spawn("docker-info", [sys.executable, str(DOCKER_INFO), str(answers)])
        self._spawn("containerd", argv)
        self._wait("docker-info", CONTAINERD_READY_TIMEOUT, answers.exists)
        self._wait("containerd", CONTAINERD_READY_TIMEOUT, self._containerd_ready)
        # The claim lives while containerd, this process or the reaper does (containerd is down while a
        # device restarts).
        reaper = [self._reaper.pid] if self._reaper is not None else []
        node_host.update_claim(self.network, self.state_dir, pids=[os.getpid(), *reaper, *self.pids.values()])
        if kubelet:
            self.start_kubelet()

    def start_kubelet(self) -> None:
        """Start the kubelet in containerd's mount namespace; return once its ``/healthz`` is ok."""
        if not self._alive("containerd"):
            raise host.ControlPlaneError(f"node {self.name}: containerd is not running; power the node on")
        argv = node_config.kubelet_flags(
            self.kubelet_binary,
            name=self.name,
            kubeconfig=self.kubeconfig,
            layout=self.layout,
            labels=self.labels,
            extra=self.kubelet_args,
        )
        argv = node_host.in_mounts_of(argv, nsenter=self.tools.nsenter, pid=self.pids["containerd"])
        if self.supervised:
            argv = [sys.executable, str(Path(__file__).with_name("supervise.py")), "--", *argv]
        self._spawn("kubelet", argv)
        self._save()
        self._wait("kubelet", KUBELET_READY_TIMEOUT, lambda: self.healthz()[0] == 200)

    def stop_kubelet(self) -> None:
        """Stop the kubelet alone (SIGTERM, then SIGKILL); the containers keep running."""
        self._terminate("kubelet")

    def restart_kubelet(self) -> None:
        """The kubelet alone stopped and started again (same directories, same containerd); a supervised one
        is asked to restart (SIGHUP to its supervisor), which it does from whatever :attr:`kubelet_binary` is."""
        if self.supervised:  # returns once the new kubelet runs, as systemctl restart does
            node_host.restart_supervised(self.pids["kubelet"], timeout=KUBELET_READY_TIMEOUT)
            return
        self.stop_kubelet()
        self.start_kubelet()

    def power_off(self) -> None:
        """A power cut: SIGKILL for the kubelet, containerd, every shim of this containerd and every
        process in the node's cgroups (the pods' containers), at once; their mounts go with the
        node's mount namespace. Directories on disk stay, as a disk does."""
        ours = {name: pid for name, pid in self.pids.items() if self._alive(name)}
        node_host.kill_all(ours.values())
        for name in ours:
            self._reap(name)
        for _ in range(10):  # a shim may start a process while it dies; look again until none is left
            victims = node_host.shim_pids(self.layout.socket) | node_host.cgroup_pids(self.cgroup_root)
            if not victims:
                return
            node_host.kill_all(victims)
        raise host.ControlPlaneError(f"node {self.name}: processes keep appearing in {self.cgroup_root}")

    def restart_device(self, *, kubelet: bool = True) -> None:
        """:meth:`power_off`, then :meth:`power_on` on the same directories."""
        self.power_off()
        self.power_on(kubelet=kubelet)

    def stop(self) -> None:
        """Stop the kubelet and containerd (SIGTERM first), kill every shim and container of the node,
        remove its cgroups, delete its bridge and release its pod network. Idempotent."""
        self._terminate("kubelet")
        self._terminate("containerd")
        self._terminate("docker-info")
        self.power_off()
        problems = node_host.remove_cgroup_root(self.cgroup_root)
        node_host.release_network(self.network, self.state_dir, self.tools.ip)
        shutil.rmtree(self.layout.short_dir, ignore_errors=True)
        self._save()
        self._dismiss_reaper()
        if problems:
            raise host.ControlPlaneError(f"node {self.name}: cgroups left behind: {'; '.join(problems[:3])}")

    # -- internals ---------------------------------------------------------------------------------

    def _marker(self, name: str) -> str:
        markers = {"containerd": self.layout.containerd_config, "docker-info": self.layout.docker_info_socket}
        return str(markers.get(name, self.layout.kubelet_config))

    def _alive(self, name: str) -> bool:
        child = self._children.get(name)
        if child is not None:
            return child.poll() is None
        pid = self.pids.get(name)
        return pid is not None and children.pid_is_ours(pid, self._marker(name))

    def _spawn(self, name: str, argv: list[str]) -> None:
        child = children.spawn(name, argv, log=self.layout.log(name), detach=self.detached)
        self._children[name] = child
        self.pids[name] = child.pid
        self._save()

    def _reap(self, name: str) -> None:
        child = self._children.pop(name, None)
        if child is not None:
            child.wait()
        self.pids.pop(name, None)

    def _terminate(self, name: str) -> None:
        pid = self.pids.get(name)
        if pid is not None:
            children.terminate(pid, self._marker(name), self._children.get(name))
        self._reap(name)

    def _wait(self, name: str, timeout: float, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            child = self._children.get(name)
            if child is not None and child.poll() is not None:
                log = self.layout.log(name)
                raise host.ControlPlaneError(
                    f"node {self.name}: {name} exited with status {child.returncode} during start-up; "
                    f"log {log}:\n{children.tail(log)}"
                )
            if time.monotonic() >= deadline:
                log = self.layout.log(name)
                raise host.ControlPlaneError(
                    f"node {self.name}: {name} not ready after {timeout:.0f}s; log {log}:\n{children.tail(log)}"
                )
            time.sleep(0.1)

    def _containerd_ready(self) -> bool:
        log = self.layout.log("containerd").read_text(errors="replace")
        if "containerd successfully booted" not in log.rpartition("==== ")[2]:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(self.layout.socket))
            except OSError:
                return False
        return True

    def _watch_over(self) -> None:
        self._reaper = node_host.start_reaper(
            Path(__file__).with_name("node.py"), self.state_dir, self.layout.log("reaper")
        )

    def _dismiss_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            node_host.dismiss_reaper(reaper)

    def _save(self) -> None:
        record = {
            "name": self.name,
            "kubeconfig": str(self.kubeconfig),
            "network": self.network.index,
            "cgroup_root": self.cgroup_root,
            "kubelet_port": self.kubelet_port,
            "healthz_port": self.healthz_port,
            "labels": self.labels,
            "kubelet_args": self.kubelet_args,
            "supervised": self.supervised,
            "pids": self.pids,
            "tools": {k: str(v) for k, v in vars(self.tools).items() if isinstance(v, Path)},
            "images": {"pause": str(self.tools.images.pause), "web": str(self.tools.images.web)},
        }
        host.write_atomic(self.layout.record, json.dumps(record, indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> Node:
        """The node recorded in ``state_dir`` (by a start in another process), to stop or restart it."""
        layout = Layout(state_dir.expanduser().resolve())
        try:
            raw = json.loads(layout.record.read_text())
            images = node_images.Images(pause=Path(raw["images"]["pause"]), web=Path(raw["images"]["web"]))
            return cls(
                name=str(raw["name"]),
                layout=layout,
                kubeconfig=Path(raw["kubeconfig"]),
                tools=node_host.NodeTools(**{k: Path(v) for k, v in raw["tools"].items()}, images=images),
                network=Network(int(raw["network"])),
                cgroup_root=str(raw["cgroup_root"]),
                kubelet_port=int(raw["kubelet_port"]),
                healthz_port=int(raw["healthz_port"]),
                labels=dict(raw["labels"]),
                kubelet_args=list(raw["kubelet_args"]),
                detached=True,
                supervised=bool(raw.get("supervised", False)),
                pids={k: int(v) for k, v in raw["pids"].items()},
            )
        except FileNotFoundError:
            raise host.ControlPlaneError(f"no node recorded in {layout.state_dir}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise host.ControlPlaneError(f"unreadable {layout.record}: {exc!r}") from None


def start_node(
    state_dir: Path,
    name: str,
    kubeconfig: Path,
    tools: node_host.NodeTools | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    kubelet_args: Sequence[str] = (),
    kubelet_settings: Mapping[str, object] | None = None,
    detach: bool = False,
    supervised: bool = False,
    healthz_port: int = 0,
) -> Node:
    """Start node ``name`` with everything in ``state_dir`` (created, or empty), its kubelet using
    ``kubeconfig`` (any server URL); return once the kubelet's ``/healthz`` is ok.

    ``labels`` are the kubelet's ``--node-labels``; ``kubelet_args`` more kubelet flags; ``kubelet_settings``
    keys of its KubeletConfiguration (those with no flag, such as ``nodeLeaseDurationSeconds``). With
    ``detach=False`` (tests) the kernel also terminates containerd and the kubelet if the calling
    process dies without :meth:`Node.stop` (shims and containers then stay until a ``stop`` of the same
    state directory); ``detach=True`` lets them outlive the caller. ``supervised``: see :attr:`Node.supervised`;
    ``healthz_port``: the kubelet's (0: a free one).
    """
    if len(name) > 63 or not _NODE_NAME.match(name):
        raise host.ControlPlaneError(f"{name!r} is not a valid node name (lower-case letters, digits, - and .)")
    if not kubeconfig.is_file():
        raise host.ControlPlaneError(f"kubeconfig {kubeconfig} of node {name} does not exist")
    tools = tools or node_host.ensure_node_tools()
    layout = Layout(state_dir.expanduser().resolve())
    layout.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if any(layout.state_dir.iterdir()):
        raise host.ControlPlaneError(f"refusing to use non-empty directory {layout.state_dir} for node {name}")
    if len(str(layout.socket)) + len(".ttrpc") > 107:
        raise host.ControlPlaneError(f"socket path {layout.socket}.ttrpc is longer than a unix socket's 107 bytes")
    for directory in (layout.containerd_dir, layout.cni_conf_dir, layout.ipam_dir, layout.kubelet_cert_dir):
        directory.mkdir(parents=True)
    network = node_host.claim_network(layout.state_dir, pids=[os.getpid()])
    kubelet_port, free = ports.free_ports(2)
    node = Node(
        name=name,
        layout=layout,
        kubeconfig=kubeconfig.resolve(),
        tools=tools,
        network=network,
        cgroup_root=node_host.cgroup_root(name, layout.state_dir),
        kubelet_port=kubelet_port,
        healthz_port=healthz_port or free,
        labels=dict(labels or {}),
        kubelet_args=list(kubelet_args),
        detached=detach,
        supervised=supervised,
    )
    if supervised:
        shutil.copy2(tools.kubelet, node.kubelet_binary)
    host.write_atomic(layout.containerd_config, node_config.containerd_toml(layout))
    host.write_atomic(layout.cni_conf_dir / "10-nodetaskd.conflist", node_config.cni_conflist(network, layout))
    node_inspect.make_inspector(layout.inspector_dir, name)
    kubelet_config = node_config.kubelet_configuration(
        port=kubelet_port,
        healthz_port=node.healthz_port,
        cgroup_root=node.cgroup_root,
        layout=layout,
        settings=kubelet_settings,
    )
    host.write_atomic(layout.kubelet_config, kubelet_config)
    try:
        if not detach:
            node._watch_over()
        node.power_on(kubelet=False)
        node_images.import_images(tools.ctr, layout.socket, tools.images)
        node.start_kubelet()
    except BaseException:
        with contextlib.suppress(host.ControlPlaneError):
            node.stop()
        raise
    return node


__all__ = [
    "KUBELET_READY_TIMEOUT",
    "Node",
    "kubelet_restart_command",
    "start_node",
]
