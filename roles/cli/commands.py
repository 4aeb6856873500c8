"""The commands beside the roles: ``nodetaskd edge join|reset``, ``token create``, ``certs create``, ``ctl ...``.

``nodetaskd --role=...`` runs a role (``roles.cli.main``); a first argument naming one of :data:`COMMANDS`
runs one of these instead. ``edge`` runs on a device's base install; the others talk to the API
server (the cloud extra), and ``ctl watch``'s live view wants rich (the ``ctl`` extra). The
kubeconfig is ``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``, else the pod's
ServiceAccount.

Exit status: 0 done (``ctl watch``: every job Completed); 1 a watched job ended in Failure or was
deleted, or a write on the device failed; 2 bad arguments, or a job or input that does not fit;
3 the API server could not be reached or refused, or an extra is missing; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from roles.cli.ctl.commands import add_ctl_parsers, add_namespace
from roles.cli.parsing import (
    DIRECTORIES,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    FILES,
    Parser,
    completes,
    fail,
)
from roles.cli.with_api import api_errors, kubeconfig_path, with_kube

__all__ = ["COMMANDS", "SUMMARIES", "kubeconfig_path", "main"]

SUMMARIES: Final = {
    "ctl": "node jobs, Diagnoses and edges, for operators",
    "edge": "install the edge agent on this device, show its status, or remove it",
    "token": "edge tokens",
    "certs": "serving certificates of a cluster install",
    "completion": "a shell's completion script: source <(nodetaskd completion bash)",
}
"""Each command's line in ``nodetaskd --help`` and in its own parser."""
COMMANDS: Final = frozenset(SUMMARIES)
EDGE_CONFIG: Final = "/etc/nodetaskd/edge.yaml"
"""Where ``edge join`` writes the agent's configuration on a device (``roles.cli.join_layout``)."""
DEFAULT_TOKEN_NAMESPACE: Final = "kube-system"
"""The hubs' ``tokenNamespace`` default (``roles.common.config.CloudConfig``)."""
DEFAULT_INSTALL_NAMESPACE: Final = "nodetaskd-system"
"""Where ``containers/deploy`` runs nodetaskd."""

# ------------------------------------------------------------------------------------------ edge


def _edge_status(args: argparse.Namespace) -> int:
    from roles.cli.edge_status import AgentUnreachable, ask, render
    from roles.common.config import ConfigError, load_config
    from roles.common.edge_config import EdgeConfig
    from roles.edge.control import control_socket

    try:
        cfg = load_config("edge", Path(args.config), {})
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    assert isinstance(cfg, EdgeConfig)
    try:
        status = ask(control_socket(Path(cfg.data_dir)))
    except AgentUnreachable as exc:
        return fail(f"{exc} (is the agent running? systemctl status nodetaskd-edge)", EXIT_UNAVAILABLE)
    except ValueError as exc:
        return fail(str(exc), EXIT_FAILED)
    if args.output == "json":
        sys.stdout.write(json.dumps(status, indent=2) + "\n")
    else:
        sys.stdout.write(render(status))
    return 0


def _edge_join(args: argparse.Namespace) -> int:
    from roles.cli.join import join
    from roles.cli.join_layout import JoinError

    def ask_hubs(hubs: tuple[str, ...], *, node: str, token: str, ca: str | None) -> list[str]:
        from roles.cli.join_probe import probe_hubs, verdict

        return verdict(probe_hubs(hubs, node=node, token=token, ca=ca))

    try:
        done = join(
            root=Path(args.root),
            node=args.node,
            hubs=tuple(args.hub),
            token_file=Path(args.token_file),
            ca_file=Path(args.ca_file) if args.ca_file else None,
            force=args.force,
            allow_plain_ws=args.allow_plain_ws,
            probe=None if args.no_hub_check else ask_hubs,
        )
    except JoinError as exc:
        return fail(str(exc), EXIT_USAGE)
    except OSError as exc:
        return fail(f"{exc}; `nodetaskd edge reset` removes what was written", EXIT_FAILED)
    sys.stdout.write("".join(f"{line}\n" for line in done))
    return 0


def _edge_reset(args: argparse.Namespace) -> int:
    from roles.cli.join_layout import JoinError, ResetError
    from roles.cli.reset import reset

    try:
        done = reset(root=Path(args.root))
    except ResetError as exc:
        sys.stdout.write("".join(f"{line}\n" for line in exc.done))
        return fail(str(exc), EXIT_FAILED)
    except JoinError as exc:
        return fail(str(exc), EXIT_FAILED)
    except OSError as exc:
        return fail(str(exc), EXIT_FAILED)
    sys.stdout.write("".join(f"{line}\n" for line in done))
    return 0


# ------------------------------------------------------------------------------------------ cloud side


@api_errors
def _token_create(args: argparse.Namespace) -> int:
    from roles.cli.tokens import create_token, join_command, write_token

    namespace = args.namespace or DEFAULT_TOKEN_NAMESPACE
    token_file = Path(args.token_file or f"{args.node}.token")
    if args.token_file != "-" and not args.force and (token_file.exists() or token_file.is_symlink()):
        # Refused before the Secret changes: a rotated token that cannot be written would be lost.
        return fail(f"{token_file} exists: give --force to overwrite it, or another --token-file", EXIT_USAGE)
    created = with_kube(args, lambda kube: create_token(kube, args.node, namespace=namespace))
    what = "rotated the token in" if created.rotated else "created"
    lines = [f"{what} Secret {created.namespace}/{created.secret} (labelled for the hubs to watch)"]
    if created.rotated:
        lines.append("the previous token is refused from now on: the edge needs the new one")
    if not created.node_exists:
        lines.append(f"note: there is no Node {created.node} yet; jobs select Nodes, the hubs accept the edge anyway")
    if args.token_file == "-":
        sys.stdout.write(f"{created.token}\n")
        sys.stderr.write("".join(f"{line}\n" for line in lines))
        return 0
    try:
        write_token(token_file, created.token, overwrite=args.force)
    except FileExistsError:
        return fail(
            f"{token_file} appeared while the token was made and is kept; the new token is written nowhere:"
            " run token create again, with --force to overwrite it",
            EXIT_FAILED,
        )
    lines.append(f"wrote the token to {token_file} (0600): copy it to the device, then run there:")
    command = join_command(created.node, hubs=tuple(args.hub), token_file=token_file.name, ca_file=args.ca_file)
    lines.append(f"  {command}")
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


@api_errors
def _certs_create(args: argparse.Namespace) -> int:
    from roles.cli.certs import create_certs, write_ca

    namespace = args.namespace or DEFAULT_INSTALL_NAMESPACE
    created = with_kube(
        args,
        lambda kube: create_certs(kube, namespace=namespace, hub_hosts=tuple(args.hub_host), rotate=args.rotate),
    )
    lines = [f"created Secret {name}" for name in created.written]
    lines += [f"kept Secret {name} (it exists; --rotate replaces it)" for name in created.kept]
    if created.hub_ca is not None:
        write_ca(Path(args.ca_out), created.hub_ca)
        lines.append(f"wrote the hubs' CA to {args.ca_out}: give it to each edge (`nodetaskd edge join --ca-file`)")
    if args.rotate and created.written:
        lines.append(
            f"restart what mounts them: kubectl -n {namespace} rollout restart"
            " deployment/nodetaskd-controller deployment/nodetaskd-cloud"
        )
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


# ------------------------------------------------------------------------------------------ parser


KUBECONFIG_HELP: Final = "kubeconfig path (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
CONTEXT_HELP: Final = "the kubeconfig's context to use (default: its current context)"
NAMESPACE_HELP: Final = "the namespace of the command's objects (each command's --help says its default)"
GLOBAL_OPTIONS: Final = frozenset({"--kubeconfig", "--context", "-n", "--namespace"})
"""Options every command that talks to the API server takes before its name as well as after it, as kubectl's."""


def command_index(arguments: Sequence[str]) -> int | None:
    """Where the command's name is in ``arguments``, past any :data:`GLOBAL_OPTIONS` (``--kubeconfig X`` or
    ``--kubeconfig=X``); None when they do not start with one."""
    index = 0
    while index < len(arguments):
        word = arguments[index]
        if word in COMMANDS:
            return index
        name, equals, _ = word.partition("=")
        if word.startswith("-n") and len(word) > 2 and not word.startswith("--"):
            index += 1  # -nNAMESPACE
            continue
        if name not in GLOBAL_OPTIONS:
            return None
        index += 1 if equals else 2
    return None


def _completion(args: argparse.Namespace) -> int:
    from roles.cli.completion import completion_script

    sys.stdout.write(completion_script(_parser(), args.shell))
    return 0


def _parser() -> argparse.ArgumentParser:
    top = Parser(prog="nodetaskd", description="Install, connect and operate nodetaskd.")
    completes(top.add_argument("--kubeconfig", help=KUBECONFIG_HELP), FILES)
    top.add_argument("--context", help=CONTEXT_HELP)
    top.add_argument("-n", "--namespace", help=NAMESPACE_HELP)
    commands = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    # After the command too; absent there, the value given before it stays (SUPPRESS adds no default).
    kube = Parser(add_help=False)
    completes(kube.add_argument("--kubeconfig", default=argparse.SUPPRESS, help=KUBECONFIG_HELP), FILES)
    kube.add_argument("--context", default=argparse.SUPPRESS, help=CONTEXT_HELP)
    _edge_parsers(commands)
    _cloud_parsers(commands, kube)
    add_ctl_parsers(commands, kube, help=SUMMARIES["ctl"])
    completion = commands.add_parser("completion", help=SUMMARIES["completion"])
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    completion.set_defaults(handler=_completion)
    return top


def _edge_parsers(commands: argparse._SubParsersAction[Parser]) -> None:
    edge = commands.add_parser("edge", help=SUMMARIES["edge"])
    edge_commands = edge.add_subparsers(dest="action", required=True, parser_class=Parser)
    join = edge_commands.add_parser("join", help="write the agent's configuration, data directory and systemd unit")
    join.add_argument("--hub", action="append", default=[], required=True, help="wss:// URL of the hubs (repeatable)")
    join.add_argument("--node", required=True, help="this device's Kubernetes node name")
    completes(
        join.add_argument("--token-file", required=True, help="the node's token (from `nodetaskd token create`)"), FILES
    )
    completes(
        join.add_argument("--ca-file", help="the CA the hubs' certificate is checked against (default: the system's)"),
        FILES,
    )
    completes(
        join.add_argument("--root", default="/", help="install under this directory instead of / (tests, images)"),
        DIRECTORIES,
    )
    join.add_argument("--force", action="store_true", help="overwrite an existing join (the data is kept)")
    join.add_argument("--allow-plain-ws", action="store_true", help="accept ws:// hubs (the token is sent unencrypted)")
    join.add_argument(
        "--no-hub-check",
        action="store_true",
        help="write without asking the hubs whether they take the token (a device installed away from its network)",
    )
    join.set_defaults(handler=_edge_join)
    status = edge_commands.add_parser("status", help="the running agent's hub session, tasks, outbox and autonomy")
    completes(
        status.add_argument("--config", default=EDGE_CONFIG, help="the agent's configuration (join writes it here)"),
        FILES,
    )
    status.add_argument("-o", "--output", choices=("table", "json"), default="table")
    status.set_defaults(handler=_edge_status)
    reset = edge_commands.add_parser("reset", help="remove what join wrote (stop the agent first)")
    completes(reset.add_argument("--root", default="/", help="the directory join installed under"), DIRECTORIES)
    reset.set_defaults(handler=_edge_reset)


def _cloud_parsers(commands: argparse._SubParsersAction[Parser], kube: Parser) -> None:
    token = commands.add_parser("token", help=SUMMARIES["token"])
    token_commands = token.add_subparsers(dest="action", required=True, parser_class=Parser)
    create = token_commands.add_parser("create", parents=[kube], help="create or rotate NODE's token Secret")
    create.add_argument("node", help="the edge's node name")
    add_namespace(create, help=f"the hubs' tokenNamespace (default: {DEFAULT_TOKEN_NAMESPACE})")
    completes(
        create.add_argument("--token-file", help="where to write the token (default: NODE.token; - prints it)"), FILES
    )
    create.add_argument("--force", action="store_true", help="overwrite an existing token file")
    create.add_argument("--hub", action="append", default=[], help="the hubs' wss:// URL, for the join command")
    create.add_argument("--ca-file", default="", help="the hubs' CA file name, for the join command")
    create.set_defaults(handler=_token_create)

    certs = commands.add_parser("certs", help=SUMMARIES["certs"])
    certs_commands = certs.add_subparsers(dest="action", required=True, parser_class=Parser)
    make = certs_commands.add_parser(
        "create", parents=[kube], help="create the Secrets nodetaskd-webhook-tls and nodetaskd-hub-tls"
    )
    add_namespace(make, help=f"where containers/deploy/ runs nodetaskd (default: {DEFAULT_INSTALL_NAMESPACE})")
    make.add_argument(
        "--hub-host", action="append", default=[], help="a DNS name or IP address edges reach the hubs at (repeatable)"
    )
    completes(
        make.add_argument("--ca-out", default="nodetaskd-hub-ca.crt", help="where to write the hubs' CA for the edges"),
        FILES,
    )
    make.add_argument("--rotate", action="store_true", help="replace existing Secrets (then restart the pods)")
    make.set_defaults(handler=_certs_create)


def main(argv: Sequence[str]) -> int:
    """Run the command ``argv`` names (past :data:`GLOBAL_OPTIONS`, see :func:`command_index`)."""
    args = _parser().parse_args(list(argv))
    if getattr(args, "all", False) and getattr(args, "nodes", None):
        return fail("ctl confirm: name nodes or give --all, not both", EXIT_USAGE)
    try:
        status: int = args.handler(args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("roles."):
            raise
        extra = "ctl" if exc.name == "rich" else "cloud"
        return fail(
            f"nodetaskd {args.command} needs the {extra} extra (pip install 'nodetaskd[{extra}]'):"
            f" module {exc.name} is not installed",
            EXIT_UNAVAILABLE,
        )
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return status
