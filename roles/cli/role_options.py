"""The options of ``nodetaskd --role=...``, for the roles' parser and, beside the commands, for completion."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from roles.cli.parsing import DIRECTORIES, FILES, completes
from roles.common.version import package_version

__all__ = ["ROLE_ALIASES", "add_role_options"]

ROLE_ALIASES: Final = {"controller": "controller", "cloud": "cloud", "cloudhub": "cloud", "edge": "edge"}


def add_role_options(p: argparse.ArgumentParser, *, beside_commands: bool = False) -> None:
    """The options of ``nodetaskd --role=...``; ``beside_commands``: into the commands' parser (for shell
    completion), where ``--role`` is not required and ``--kubeconfig`` is already one of its global options."""
    p.add_argument("--version", action="version", version=f"nodetaskd {package_version()}")
    p.add_argument(
        "--role", required=not beside_commands, choices=sorted(ROLE_ALIASES), help="which role this process plays"
    )
    completes(p.add_argument("--config", type=Path, help="YAML configuration file of the role"), FILES)
    p.add_argument("--check-config", action="store_true", help="print the effective configuration and exit")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-format", choices=("console", "json"))
    if not beside_commands:
        kubeconfig = p.add_argument("--kubeconfig", help="controller, cloud: kubeconfig path (default: in-cluster)")
        completes(kubeconfig, FILES)
    p.add_argument("--feature-gates", action="append", default=[], help="controller: gates to enable, comma-separated")
    p.add_argument("--listen", help="cloud: host:port of the websocket hub")
    p.add_argument("--node-name", help="edge: the node this agent acts for")
    p.add_argument("--hub-url", action="append", default=[], help="edge: a cloud hub URL (repeatable)")
    completes(p.add_argument("--data-dir", help="edge: directory of the durable local state"), DIRECTORIES)
    p.add_argument(
        "--confirm", metavar="JOB", help="edge: release JOB's upgrade waiting for confirmation on this node, then exit"
    )
