"""What a real node takes from the machine it shares with other nodes, and gives back: Debian's executables
(and the kubelet built from Debian's source), a cgroup root of its own in every hierarchy, a pod network
index (bridge and /24) claimed under a lock, a mount namespace in which its containerd and kubelet see
directories of their own, and, at power-off, the end of every process it started (kubelet, containerd,
shims, containers).

Standard library only, like the other provisioning scripts.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tools.provision import children, host, kubebuild, node_config, node_images
from tools.provision.node_config import Network

_EXECUTABLES: Final[Mapping[str, str]] = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "containerd-shim-runc-v2": "containerd",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ip": "iproute2",
    "iptables": "iptables",  # portmap's teardown runs it for every pod
}
_CNI_PACKAGE: Final = "containernetworking-plugins"


@dataclass(frozen=True)
class NodeTools:
    """The executables a node runs, all from Debian (the kubelet built from Debian's source)."""

    containerd: Path
    ctr: Path
    kubelet: Path
    unshare: Path
    nsenter: Path
    ip: Path
    images: node_images.Images


def ensure_node_tools() -> NodeTools:
    """Install what is missing (containerd, runc, the CNI plugins, util-linux, iproute2, iptables), build
    the kubelet and the pause program if they are not cached, and pack the two images."""
    found = host.ensure_executables(_EXECUTABLES)
    if not all((node_config.CNI_BIN_DIR / plugin).is_file() for plugin in ("bridge", "host-local", "portmap")):
        with host.file_lock(host.cache_dir() / "apt.lock"):
            host.apt_install([_CNI_PACKAGE])
    kubelet = kubebuild.ensure_built(("kubelet",))["kubelet"]
    return NodeTools(
        containerd=found["containerd"],
        ctr=found["ctr"],
        kubelet=kubelet,
        unshare=found["unshare"],
        nsenter=found["nsenter"],
        ip=found["ip"],
        images=node_images.ensure_images(),
    )


NETWORK_CLAIMS: Final = Path("/run/nodetaskd/node-networks")
"""One ``<index>.json`` per claimed pod network (on tmpfs: a reboot frees them all)."""
KILL_TIMEOUT: Final = 15.0


def cgroup_root(name: str, state_dir: Path) -> str:
    """The node's cgroup root: its name and a hash of its state directory, so that two test sessions'
    nodes of the same name never share one (a kubelet kills the pods of cgroups under its root it does
    not know)."""
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]
    return f"/nodetaskd/{name}-{digest}"


def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, named ones, and the v2 one if mounted)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        if fields[separator + 1] in ("cgroup", "cgroup2"):
            mounts.append(Path(fields[4]))
    return mounts


def make_cgroup_root(root: str) -> None:
    """Create ``root`` in every hierarchy (the kubelet refuses a cgroup root missing from any of them). In
    cpuset's, each new level gets its parent's CPUs and memory nodes, or no process could join it."""
    for mount in cgroup_mounts():
        path = mount
        for part in Path(root).relative_to("/").parts:
            parent, path = path, path / part
            if path.is_dir():
                continue
            path.mkdir()
            for setting in ("cpuset.cpus", "cpuset.mems"):
                if (parent / setting).is_file():
                    (path / setting).write_text((parent / setting).read_text())


def _cgroup_dirs(root: str) -> list[Path]:
    """Every directory of ``root``'s cgroups in every hierarchy, deepest first."""
    found: list[Path] = []
    for mount in cgroup_mounts():
        top = mount / Path(root).relative_to("/")
        if top.is_dir():
            found.extend(Path(d) for d, _, _ in os.walk(top))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(root: str) -> set[int]:
    """Processes in any cgroup under ``root`` (a node's containers)."""
    pids: set[int] = set()
    for directory in _cgroup_dirs(root):
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
    return pids


def remove_cgroup_root(root: str) -> list[str]:
    """Remove ``root``'s cgroups (deepest first); the ones that would not go, with why."""
    problems = []
    for directory in _cgroup_dirs(root):
        try:
            directory.rmdir()
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{directory}: {exc.strerror}")
    return problems


def _routed_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 destinations of the machine's routing table."""
    networks = []
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        fields = line.split()
        destination = ipaddress.IPv4Address(bytes.fromhex(fields[1])[::-1])
        mask = ipaddress.IPv4Address(bytes.fromhex(fields[7])[::-1])
        if int(mask):
            networks.append(ipaddress.IPv4Network(f"{destination}/{mask}", strict=False))
    return networks


def _claim_alive(claim: Path) -> bool:
    try:
        record = json.loads(claim.read_text())
        pids = [int(p) for p in record["pids"]]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return any(children.proc_state(pid) not in (None, "Z", "X") for pid in pids)


def claim_network(state_dir: Path, *, pids: Iterable[int]) -> Network:
    """The lowest free pod network index (no live claim, no route on the machine into its /24), claimed
    for ``state_dir`` while any of ``pids`` lives."""
    NETWORK_CLAIMS.mkdir(parents=True, exist_ok=True)
    with host.file_lock(NETWORK_CLAIMS / ".lock"):
        routed = _routed_networks()
        for index in range(1, 255):
            network = Network(index)
            claim = NETWORK_CLAIMS / f"{index}.json"
            if claim.exists() and _claim_alive(claim):
                continue
            subnet = ipaddress.IPv4Network(network.subnet)
            bridge_exists = Path(f"/sys/class/net/{network.bridge}").exists()
            if not bridge_exists and any(subnet.overlaps(r) for r in routed):
                continue
            update_claim(network, state_dir, pids=pids)
            return network
    raise host.ControlPlaneError(f"no free pod network left in 10.233.0.0/16 (claims in {NETWORK_CLAIMS})")


def update_claim(network: Network, state_dir: Path, *, pids: Iterable[int]) -> None:
    record = {"state_dir": str(state_dir), "pids": sorted(set(pids))}
    host.write_atomic(NETWORK_CLAIMS / f"{network.index}.json", json.dumps(record) + "\n")


def release_network(network: Network, state_dir: Path, ip: Path | None) -> None:
    """Delete the node's bridge (CNI never does) and its claim, if the claim is still the node's."""
    claim = NETWORK_CLAIMS / f"{network.index}.json"
    with host.file_lock(NETWORK_CLAIMS / ".lock"):
        try:
            owner = json.loads(claim.read_text()).get("state_dir")
        except (OSError, ValueError):
            return
        if owner != str(state_dir):
            return
        if ip is not None and Path(f"/sys/class/net/{network.bridge}").exists():
            with contextlib.suppress(host.ControlPlaneError):
                host.run_quiet([str(ip), "link", "delete", network.bridge], what=f"ip link delete {network.bridge}")
        claim.unlink(missing_ok=True)


def in_private_mounts(argv: list[str], *, unshare: Path, binds: Mapping[str, Path], tmpfs: Iterable[str]) -> list[str]:
    """``argv`` run in a new mount namespace in which each ``binds`` machine path (key) is a bind mount of
    the node's own directory (value) and each ``tmpfs`` path an empty tmpfs. What the process and its
    children (containerd's shims, runc, CNI plugins) mount there stays there, and goes when the last of
    them exits: a reboot's clean slate."""
    steps = []
    for target, source in binds.items():
        steps.append(f"mkdir -p {shlex.quote(target)} {shlex.quote(str(source))}")
        steps.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
    for target in tmpfs:
        steps.append(f"mkdir -p {shlex.quote(target)}")
        steps.append(f"mount -t tmpfs -o mode=0711 nodetaskd-node {shlex.quote(target)}")
    script = " && ".join([*steps, 'exec "$@"'])
    return [str(unshare), "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", *argv]


def in_mounts_of(argv: list[str], *, nsenter: Path, pid: int) -> list[str]:
    """``argv`` run in the mount namespace of process ``pid`` (the kubelet in its containerd's)."""
    return [str(nsenter), f"--mount=/proc/{pid}/ns/mnt", "--", *argv]


def shim_pids(socket: Path) -> set[int]:
    """containerd shims serving the containerd at ``socket`` (their command line names its address)."""
    marker = f"-address {socket} "
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "containerd-shim" in command and marker in command + " ":
            found.add(int(entry.name))
    return found


def kill_all(pids: Iterable[int], *, also: Iterable[int] = ()) -> None:
    """SIGKILL ``pids`` and ``also`` (already vetted as ours), then wait until each has gone."""
    victims = set(pids) | set(also)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_TIMEOUT
    while any(children.proc_state(pid) not in (None, "Z", "X") for pid in victims):
        if time.monotonic() >= deadline:
            left = sorted(p for p in victims if children.proc_state(p) not in (None, "Z", "X"))
            raise host.ControlPlaneError(f"processes {left} survived SIGKILL for {KILL_TIMEOUT:.0f}s")
        time.sleep(0.05)


__all__ = [
    "NETWORK_CLAIMS",
    "NodeTools",
    "cgroup_mounts",
    "cgroup_pids",
    "cgroup_root",
    "claim_network",
    "ensure_node_tools",
    "in_mounts_of",
    "in_private_mounts",
    "kill_all",
    "make_cgroup_root",
    "release_network",
    "remove_cgroup_root",
    "shim_pids",
    "update_claim",
]


def start_reaper(node_py: Path, state_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """A node's reaper: a process that stops the node should its starter die without stopping it (it
    reads its stdin to the end: a word means dismissed, nothing means its parent is gone). The kernel
    ends containerd and the kubelet with their parent, but not the shims and containers."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, str(node_py), "reap", str(state_dir)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def dismiss_reaper(reaper: subprocess.Popen[bytes]) -> None:
    """Tell a reaper the node was stopped as it should be, and wait for it to go."""
    if reaper.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            reaper.stdin.write(b"dismissed\n")
            reaper.stdin.close()
    reaper.wait()


def ctr_images(ctr: Path, socket: Path) -> set[str]:
    """The image references a node's containerd holds (CRI namespace ``k8s.io``), digests included."""
    out = host.run_quiet(
        [str(ctr), f"--address={socket}", "--namespace=k8s.io", "images", "list", "-q"], what="ctr images list"
    )
    return set(out.split())


def ctr_tasks(ctr: Path, socket: Path) -> dict[str, int]:
    """The containers a node's containerd runs now (CRI namespace ``k8s.io``): ID to its first process's PID."""
    out = host.run_quiet(
        [str(ctr), f"--address={socket}", "--namespace=k8s.io", "tasks", "list"], what="ctr tasks list"
    )
    running = {}
    for line in out.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "RUNNING":
            running[fields[0]] = int(fields[1])
    return running


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def restart_supervised(supervisor: int, *, timeout: float) -> None:
    """SIGHUP to ``supervise.py`` (pid ``supervisor``), then wait until its old child is gone and a new one runs."""
    before = _children(supervisor)
    os.kill(supervisor, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while not ((now := _children(supervisor)) and not now & before):
        if time.monotonic() >= deadline:
            raise host.ControlPlaneError(f"supervisor {supervisor} did not restart its command within {timeout:.0f}s")
        time.sleep(0.05)
