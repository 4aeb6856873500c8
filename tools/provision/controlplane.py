#!/usr/bin/env python3
"""A real control plane on loopback, for tests and the demo: etcd, kube-apiserver, kube-controller-manager.

Why this exists: nodetaskd talks to Kubernetes through CRDs, the status
subresource, optimistic concurrency (409 on a stale resourceVersion), watches
and RBAC, and its devices are real nodes whose kubelets the Node authorizer
confines. Fakes get those details subtly wrong, so tests and the demo run
against a genuine kube-apiserver backed by a genuine etcd, with a genuine
kube-controller-manager, all bound to 127.0.0.1 and owned (by PID) by whoever
started them.

Where the parts live, by concern:

- ``kubebuild.py``: kube-apiserver, kube-controller-manager, kubelet and the pause program, built from
  Debian's ``kubernetes`` source package (Debian ships no binaries) and cached in ``~/.cache/nodetaskd``;
- ``pki.py``: the cluster CA, the certificates it signs, kubeconfigs;
- ``cluster_start.py``: the flags and the start, in order; ``cluster.py``: the running cluster's handle;
- ``host.py`` (packages, files, locks), ``children.py`` (processes);
- this file: the command line, and the names other modules import from here.

The cluster, as far as nodes go, is a real one: one CA signs the serving certificate and every
client certificate (``ca_file``, ``ca_key_file``); ``--authorization-mode=Node,RBAC`` and
NodeRestriction admission; kube-controller-manager runs the controllers of
``cluster_start.CONTROLLERS`` (each with why). Left out, and why: ``podgc`` (it deletes, 40 s after it
first sees them, the pods bound to a node name no Node has, which many tests make on purpose as pods of
edges that are not real nodes; a real node's Node exists); ``ttl`` (it only annotates Nodes with
a cache TTL that kubelets read under the ``Cache`` change-detection strategy, not the default ``Watch``,
and its writes would race tests writing Nodes); ``nodeipam`` (each node's CNI configuration names its
own range); the workload controllers (deployment, replicaset, daemonset, job, statefulset, cronjob:
no scheduler runs, pods are bound by ``nodeName``); services, endpoints and routes (nothing routes
Services here); volumes and quotas; ``bootstrapsigner``/``tokencleaner`` and ``root-ca-cert-publisher``
(bootstrap tokens and projected service-account tokens are not used).

This file and its siblings are stdlib-only on purpose (like ``tools/ports.py``, which picks its
servers' ports): they must run before (or without) the project's virtualenv. Usage::

    python3 tools/provision/controlplane.py up      # build if needed, start, apply RBAC
    python3 tools/provision/controlplane.py status
    python3 tools/provision/controlplane.py env     # shell exports for the running cluster
    python3 tools/provision/controlplane.py down

It is also importable (see ``tests/integration/controlplane.py``)::

    cp = start(state_dir, ensure_binaries())
    try:
        cp.apply_rbac()
        kubeconfig = cp.node_kubeconfig("node-a")   # system:node:node-a, signed by the cluster CA
        ...
    finally:
        cp.stop()
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

try:
    from tools.provision import children, host, kubebuild
except ModuleNotFoundError:  # run as a script: tools/provision/ is on sys.path, the repository root is not
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools.provision import children, host, kubebuild

from tools.provision.cluster import (
    APISERVER_READY_TIMEOUT,
    DEFAULT_RBAC_DIR,
    IDENTITIES,
    PROCESSES,
    STATE_FILE,
    Binaries,
    ControlPlane,
    Identity,
)
from tools.provision.cluster_start import AGENT_ONLY_NODES, CONTROLLERS, NodeMonitor, ensure_binaries, start
from tools.provision.host import REPO_ROOT, ControlPlaneError, cache_dir
from tools.provision.kubebuild import APISERVER_BUILD_REVISION, KUBERNETES_VERSION

# The scripts that reached these helpers through this module before it was split still do
# (tools/provision/containerd.py, image.py, tools/demo).
_which = host.which
_apt_install = host.apt_install
_file_lock = host.file_lock
_write_atomic = host.write_atomic
_pid_is_ours = children.pid_is_ours
_terminate = children.terminate
_die_with_parent = children.die_with_parent
_tail = children.tail


def _log(message: str) -> None:
    host.log(message)


def default_cluster_dir() -> Path:
    """State directory used by the CLI: ``$NODETASKD_CLUSTER_DIR`` or
    ``~/.cache/nodetaskd/cluster``."""
    env = os.environ.get("NODETASKD_CLUSTER_DIR")
    return Path(env).expanduser().resolve() if env else cache_dir() / "cluster"


def apiserver_binary_path() -> Path:
    """The cached kube-apiserver; its name carries :data:`APISERVER_BUILD_REVISION`."""
    return kubebuild.binary_path("kube-apiserver")


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _running(state_dir: Path) -> ControlPlane | None:
    """The control plane recorded in ``state_dir`` if all its processes are
    alive and the apiserver is ready, else ``None``."""
    try:
        cp = ControlPlane.load(state_dir)
    except ControlPlaneError:
        return None
    alive = cp.processes_alive()
    if set(alive) != set(PROCESSES) or not all(alive.values()):
        return None
    return cp if cp.is_ready() and cp.controller_manager_healthy() else None


def _cmd_up(state_dir: Path, rbac_dir: Path) -> int:
    started = time.monotonic()
    cp = _running(state_dir)
    if cp is not None:
        _log(f"already running at {cp.server} (state {state_dir})")
    else:
        if (state_dir / STATE_FILE).exists():
            with contextlib.suppress(ControlPlaneError):
                ControlPlane.load(state_dir).stop()  # half-dead leftovers
        binaries = ensure_binaries()
        cp = start(state_dir, binaries, detach=True)
        _log(f"started {cp.server} in {time.monotonic() - started:.1f}s (logs in {state_dir})")
    cp.apply_rbac(rbac_dir)
    print(f"export KUBECONFIG={shlex.quote(str(cp.admin_kubeconfig))}")
    return 0


def _cmd_down(state_dir: Path) -> int:
    try:
        cp = ControlPlane.load(state_dir)
    except ControlPlaneError:
        _log(f"nothing to stop (no state in {state_dir})")
        return 0
    cp.stop()
    _log("stopped")
    return 0


def _cmd_status(state_dir: Path) -> int:
    try:
        cp = ControlPlane.load(state_dir)
    except ControlPlaneError:
        print(f"not running (no state in {state_dir})")
        return 1
    alive = cp.processes_alive()
    ready = all(alive.values()) and cp.is_ready()
    print(f"{'running' if ready else 'NOT ready'}: {cp.server}")
    for name, pid in cp.pids.items():
        state = "alive" if alive.get(name) else "dead"
        print(f"  {name}: pid {pid} {state}, log {cp.logs[name]}")
    for name, path in cp.kubeconfigs.items():
        if path.exists():
            print(f"  {name}.kubeconfig: {path}")
    return 0 if ready else 1


def _cmd_env(state_dir: Path) -> int:
    cp = _running(state_dir)
    if cp is None:
        _log(f"not running (state {state_dir}); run `python3 tools/provision/controlplane.py up`")
        return 1
    print(f"export KUBECONFIG={shlex.quote(str(cp.admin_kubeconfig))}")
    for name, path in cp.kubeconfigs.items():
        print(f"export NODETASKD_{name.upper()}_KUBECONFIG={shlex.quote(str(path))}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="controlplane.py",
        description="Real etcd + kube-apiserver + kube-controller-manager on 127.0.0.1 for tests and demos.",
    )
    parser.add_argument("command", choices=("up", "down", "status", "env"))
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="cluster state directory (default: $NODETASKD_CLUSTER_DIR or ~/.cache/nodetaskd/cluster)",
    )
    parser.add_argument(
        "--rbac-dir",
        type=Path,
        default=DEFAULT_RBAC_DIR,
        help="manifests applied by `up`",
    )
    args = parser.parse_args(argv)
    state_dir: Path = (args.state_dir or default_cluster_dir()).expanduser().resolve()
    try:
        if args.command == "up":
            return _cmd_up(state_dir, args.rbac_dir)
        if args.command == "down":
            return _cmd_down(state_dir)
        if args.command == "status":
            return _cmd_status(state_dir)
        return _cmd_env(state_dir)
    except ControlPlaneError as exc:
        print(f"controlplane: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "AGENT_ONLY_NODES",
    "APISERVER_BUILD_REVISION",
    "APISERVER_READY_TIMEOUT",
    "CONTROLLERS",
    "DEFAULT_RBAC_DIR",
    "IDENTITIES",
    "KUBERNETES_VERSION",
    "REPO_ROOT",
    "STATE_FILE",
    "Binaries",
    "ControlPlane",
    "ControlPlaneError",
    "Identity",
    "NodeMonitor",
    "apiserver_binary_path",
    "cache_dir",
    "default_cluster_dir",
    "ensure_binaries",
    "main",
    "start",
]
