#!/usr/bin/env python3
"""Real Kubernetes nodes on this machine, for tests and the demo: the command line, and what to import.

A node is a containerd of its own and a stock kubelet 1.20.2 (built from Debian's source, like the
control plane) in a mount namespace of the node's own; several run on one machine at once
(``node_device.py`` says how, ``node_config.py`` what each is told, ``node_host.py`` what each takes
from the machine, ``node_images.py`` the two images it runs). The kubelet talks to whatever its
kubeconfig names: the local API server with a node certificate (``ControlPlane.node_kubeconfig``), or a
device's plain-HTTP loopback endpoint with no credentials (``pki.plain_kubeconfig``).

From the command line (the node outlives the command; needs root)::

    python3 tools/provision/node.py up STATE_DIR --name device-a --kubeconfig device-a.kubeconfig
    python3 tools/provision/node.py status|restart-device|restart-kubelet|down STATE_DIR

From Python::

    from tools.provision.node import start_node, web_pod

    node = start_node(state_dir, "device-a", kubeconfig)   # returns once the kubelet's /healthz is ok
    try:
        ...                     # kubectl create -f web_pod("web", "device-a"), ...
        node.restart_device()   # every process of the node killed; containerd and the kubelet again
    finally:
        node.stop()

``reap`` is not for people: a node started by a process that dies without stopping it is stopped by
its reaper (``node.py reap STATE_DIR``, which reads its stdin to the end).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

try:
    from tools.provision import host
except ModuleNotFoundError:  # run as a script: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools.provision import host

from tools.provision.node_device import KUBELET_READY_TIMEOUT, Node, start_node
from tools.provision.node_host import NodeTools, ensure_node_tools
from tools.provision.node_images import PAUSE_IMAGE, WEB_IMAGE, WEB_PAGE, WEB_PORT, web_pod


def _reap(state_dir: Path) -> int:
    if sys.stdin.buffer.read():
        return 0  # dismissed: the node was stopped
    host.log(f"the process that started the node in {state_dir} is gone; stopping the node", prefix="node")
    Node.load(state_dir).stop()
    return 0


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"a label is KEY=VALUE, not {text!r}")
    return key, value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node.py", description="A real Kubernetes node (containerd + kubelet).")
    parser.add_argument("command", choices=("up", "down", "status", "restart-device", "restart-kubelet", "reap"))
    parser.add_argument("state_dir", type=Path, help="the node's state directory")
    parser.add_argument("--name", help="up: the node's name")
    parser.add_argument("--kubeconfig", type=Path, help="up: the kubelet's kubeconfig (any server URL)")
    parser.add_argument("--label", type=_label, action="append", default=[], help="up: a node label KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            if not args.name or not args.kubeconfig:
                parser.error("up needs --name and --kubeconfig")
            node = start_node(args.state_dir, args.name, args.kubeconfig, labels=dict(args.label), detach=True)
            print(f"node {node.name} up: kubelet {node.healthz_url}, containerd {node.endpoint}")
            return 0
        if args.command == "reap":
            return _reap(args.state_dir)
        node = Node.load(args.state_dir)
        if args.command == "down":
            node.stop()
        elif args.command == "restart-device":
            node.restart_device()
        elif args.command == "restart-kubelet":
            node.restart_kubelet()
        else:
            alive = node.processes_alive()
            print(f"node {node.name}: " + ", ".join(f"{k} {'alive' if v else 'DEAD'}" for k, v in alive.items()))
            print(f"  kubelet /healthz: {node.healthz()}")
            return 0 if all(alive.values()) else 1
    except host.ControlPlaneError as exc:
        print(f"node: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "KUBELET_READY_TIMEOUT",
    "PAUSE_IMAGE",
    "WEB_IMAGE",
    "WEB_PAGE",
    "WEB_PORT",
    "Node",
    "NodeTools",
    "ensure_node_tools",
    "main",
    "start_node",
    "web_pod",
]
