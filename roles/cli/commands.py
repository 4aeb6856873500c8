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
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from roles.cli.parsing import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_UNAVAILABLE, EXIT_USAGE, Parser, fail, leaf

if TYPE_CHECKING:
    from roles.kube import Kube

__all__ = ["COMMANDS", "SUMMARIES", "kubeconfig_path", "main"]

SUMMARIES: Final = {
    "ctl": "node jobs and edges, for operators",
    "edge": "install the edge agent on this device, or remove it",
    "token": "edge tokens",
    "certs": "serving certificates of a cluster install",
}
"""Each command's line in ``nodetaskd --help`` and in its own parser."""
COMMANDS: Final = frozenset(SUMMARIES)
DEFAULT_TOKEN_NAMESPACE: Final = "kube-system"
"""The hubs' ``tokenNamespace`` default (``roles.common.config.CloudConfig``)."""

T = TypeVar("T")


def kubeconfig_path(flag: str | None) -> str:
    """``--kubeconfig``, else the first of ``$KUBECONFIG``, else ``~/.kube/config`` if present; empty
    means the pod's ServiceAccount (in-cluster)."""
    if flag:
        return flag
    first = next((p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p), "")
    if first:
        return first
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else ""


def _with_kube(kubeconfig: str | None, work: Callable[[Kube], Awaitable[T]]) -> T:
    """Run ``work`` with an API client (warnings of the client go to stderr)."""
    # Imported here: the edge commands must not load the cloud extra.
    import trio

    from roles.common.logs import configure_logging
    from roles.kube import open_kube

    log = configure_logging(level="warning", fmt="console")

    async def run() -> T:
        async with open_kube(kubeconfig=kubeconfig_path(kubeconfig), log=log) as kube:
            return await work(kube)

    return trio.run(run)


def _api_errors(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn the errors of commands that use the API into one line and an exit status."""

    def guarded(args: argparse.Namespace) -> int:
        from roles.cli.ctl.fetch import CtlError
        from roles.kube import ApiError, KubeconfigError

        try:
            return run(args)
        except (Exception, BaseExceptionGroup) as raised:
            # Errors raised inside the API client's task groups arrive wrapped in exception groups.
            error = leaf(raised)
            if isinstance(error, KubeconfigError):
                hint = "" if kubeconfig_path(args.kubeconfig) else "; give --kubeconfig, or set $KUBECONFIG"
                return fail(f"{error}{hint}", EXIT_UNAVAILABLE)
            if isinstance(error, CtlError | ValueError):  # a job that does not fit, a bad name or value
                return fail(str(error), EXIT_USAGE)
            if isinstance(error, ApiError):
                return fail(str(error), EXIT_UNAVAILABLE)
            if isinstance(error, OSError):  # writing the token or CA file
                return fail(str(error), EXIT_FAILED)
            raise

    return guarded


# ------------------------------------------------------------------------------------------ edge


def _edge_join(args: argparse.Namespace) -> int:
    from roles.cli.join import join
    from roles.cli.join_layout import JoinError

    try:
        done = join(
            root=Path(args.root),
            node=args.node,
            hubs=tuple(args.hub),
            token_file=Path(args.token_file),
            ca_file=Path(args.ca_file) if args.ca_file else None,
            force=args.force,
            allow_plain_ws=args.allow_plain_ws,
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


@_api_errors
def _token_create(args: argparse.Namespace) -> int:
    from roles.cli.tokens import create_token, join_command, write_token

    token_file = Path(args.token_file or f"{args.node}.token")
    if args.token_file != "-" and not args.force and (token_file.exists() or token_file.is_symlink()):
        # Refused before the Secret changes: a rotated token that cannot be written would be lost.
        return fail(f"{token_file} exists: give --force to overwrite it, or another --token-file", EXIT_USAGE)
    created = _with_kube(args.kubeconfig, lambda kube: create_token(kube, args.node, namespace=args.namespace))
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


@_api_errors
def _certs_create(args: argparse.Namespace) -> int:
    from roles.cli.certs import create_certs, write_ca

    created = _with_kube(
        args.kubeconfig,
        lambda kube: create_certs(kube, namespace=args.namespace, hub_hosts=tuple(args.hub_host), rotate=args.rotate),
    )
    lines = [f"created Secret {name}" for name in created.written]
    lines += [f"kept Secret {name} (it exists; --rotate replaces it)" for name in created.kept]
    if created.hub_ca is not None:
        write_ca(Path(args.ca_out), created.hub_ca)
        lines.append(f"wrote the hubs' CA to {args.ca_out}: give it to each edge (`nodetaskd edge join --ca-file`)")
    if args.rotate and created.written:
        lines.append(
            f"restart what mounts them: kubectl -n {args.namespace} rollout restart"
            " deployment/nodetaskd-controller deployment/nodetaskd-cloud"
        )
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


# ------------------------------------------------------------------------------------------ ctl


@_api_errors
def _ctl_get(args: argparse.Namespace) -> int:
    from roles.cli.ctl import fetch, text
    from roles.cli.ctl.views import find_kind
    from schemas.kinds import KINDS

    kinds = (find_kind(args.kind),) if args.kind else KINDS
    found = _with_kube(args.kubeconfig, lambda kube: fetch.jobs(kube, kinds))
    if args.output != "table":
        sys.stdout.write(text.encode(found, args.output))
    elif found:
        sys.stdout.write(text.jobs_table(found, now=datetime.now(UTC)))
    else:
        sys.stderr.write("no node jobs\n")
    return 0


@_api_errors
def _ctl_describe(args: argparse.Namespace) -> int:
    from roles.cli.ctl import fetch, text

    found = _with_kube(args.kubeconfig, lambda kube: fetch.describe(kube, args.job))
    if args.output != "table":
        document = {"job": found.job, "nodes": found.nodes, "events": found.events}
        sys.stdout.write(text.encode(document, args.output))
    else:
        sys.stdout.write(text.describe_text(found.job, found.nodes, found.events, now=datetime.now(UTC)))
    return 0


@_api_errors
def _ctl_confirm(args: argparse.Namespace) -> int:
    from roles.cli.ctl import fetch, text

    done = _with_kube(args.kubeconfig, lambda kube: fetch.confirm(kube, args.job, tuple(args.nodes), every=args.all))
    if args.output != "table":
        document = {"job": done.job, "before": done.before, "confirm": done.after, "paused": done.paused}
        sys.stdout.write(text.encode(document, args.output))
        return 0
    if done.after == done.before:
        sys.stdout.write(f"{done.job}: already confirmed ({done.after}), nothing to change\n")
    else:
        sys.stdout.write(f"{done.job}: confirm annotation {done.before or '(none)'} -> {done.after}\n")
    paused = ", ".join(done.paused) or "none"
    sys.stdout.write(f"paused at WaitingConfirmation now: {paused}; the hubs release the confirmed ones\n")
    return 0


@_api_errors
def _ctl_nodes(args: argparse.Namespace) -> int:
    from roles.cli.ctl import fetch, text

    rows = _with_kube(args.kubeconfig, fetch.edges)
    if args.output != "table":
        sys.stdout.write(text.encode(rows, args.output))
    elif rows:
        sys.stdout.write(text.edges_table(rows))
    else:
        sys.stderr.write("no edge Nodes (label node-role.kubernetes.io/edge)\n")
    return 0


@_api_errors
def _ctl_watch(args: argparse.Namespace) -> int:
    from roles.cli.ctl.watch import JsonLines, PlainLines, Presenter, watch

    if args.output == "yaml":
        return fail("ctl watch prints a table, or a JSON line per change with -o json", EXIT_USAGE)
    if args.output == "json":
        return _with_kube(args.kubeconfig, lambda kube: watch(kube, args.jobs, JsonLines(sys.stdout)))
    if not sys.stdout.isatty():
        return _with_kube(args.kubeconfig, lambda kube: watch(kube, args.jobs, PlainLines(sys.stdout)))
    try:
        from roles.cli.ctl.live import LiveView  # rich comes with the ctl extra only
    except ModuleNotFoundError:
        sys.stderr.write("(a line per change: the live view needs rich, pip install 'nodetaskd[ctl]')\n")
        return _with_kube(args.kubeconfig, lambda kube: watch(kube, args.jobs, PlainLines(sys.stdout)))
    with LiveView() as view:
        presenter: Presenter = view
        return _with_kube(args.kubeconfig, lambda kube: watch(kube, args.jobs, presenter))


# ------------------------------------------------------------------------------------------ parser


def _parser() -> argparse.ArgumentParser:
    top = Parser(prog="nodetaskd", description="Install, connect and operate nodetaskd.")
    commands = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    kube = Parser(add_help=False)
    kube.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    _edge_parsers(commands)
    _cloud_parsers(commands, kube)
    _ctl_parsers(commands, kube)
    return top


def _edge_parsers(commands: argparse._SubParsersAction[Parser]) -> None:
    edge = commands.add_parser("edge", help=SUMMARIES["edge"])
    edge_commands = edge.add_subparsers(dest="action", required=True, parser_class=Parser)
    join = edge_commands.add_parser("join", help="write the agent's configuration, data directory and systemd unit")
    join.add_argument("--hub", action="append", default=[], required=True, help="wss:// URL of the hubs (repeatable)")
    join.add_argument("--node", required=True, help="this device's Kubernetes node name")
    join.add_argument("--token-file", required=True, help="the node's token (from `nodetaskd token create`)")
    join.add_argument("--ca-file", help="the CA the hubs' certificate is checked against (default: the system's)")
    join.add_argument("--root", default="/", help="install under this directory instead of / (tests, images)")
    join.add_argument("--force", action="store_true", help="overwrite an existing join (the data is kept)")
    join.add_argument("--allow-plain-ws", action="store_true", help="accept ws:// hubs (the token is sent unencrypted)")
    join.set_defaults(handler=_edge_join)
    reset = edge_commands.add_parser("reset", help="remove what join wrote (stop the agent first)")
    reset.add_argument("--root", default="/", help="the directory join installed under")
    reset.set_defaults(handler=_edge_reset)


def _cloud_parsers(commands: argparse._SubParsersAction[Parser], kube: Parser) -> None:
    token = commands.add_parser("token", help=SUMMARIES["token"])
    token_commands = token.add_subparsers(dest="action", required=True, parser_class=Parser)
    create = token_commands.add_parser("create", parents=[kube], help="create or rotate NODE's token Secret")
    create.add_argument("node", help="the edge's node name")
    create.add_argument("--namespace", default=DEFAULT_TOKEN_NAMESPACE, help="the hubs' tokenNamespace")
    create.add_argument("--token-file", help="where to write the token (default: NODE.token; - prints it)")
    create.add_argument("--force", action="store_true", help="overwrite an existing token file")
    create.add_argument("--hub", action="append", default=[], help="the hubs' wss:// URL, for the join command")
    create.add_argument("--ca-file", default="", help="the hubs' CA file name, for the join command")
    create.set_defaults(handler=_token_create)

    certs = commands.add_parser("certs", help=SUMMARIES["certs"])
    certs_commands = certs.add_subparsers(dest="action", required=True, parser_class=Parser)
    make = certs_commands.add_parser(
        "create", parents=[kube], help="create the Secrets nodetaskd-webhook-tls and nodetaskd-hub-tls"
    )
    make.add_argument("--namespace", default="nodetaskd-system", help="where containers/deploy/ runs nodetaskd")
    make.add_argument(
        "--hub-host", action="append", default=[], help="a DNS name or IP address edges reach the hubs at (repeatable)"
    )
    make.add_argument("--ca-out", default="nodetaskd-hub-ca.crt", help="where to write the hubs' CA for the edges")
    make.add_argument("--rotate", action="store_true", help="replace existing Secrets (then restart the pods)")
    make.set_defaults(handler=_certs_create)


def _ctl_parsers(commands: argparse._SubParsersAction[Parser], kube: Parser) -> None:
    ctl = commands.add_parser("ctl", help=SUMMARIES["ctl"])
    options = Parser(add_help=False, parents=[kube])
    options.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    ctl_commands = ctl.add_subparsers(dest="action", required=True, parser_class=Parser)
    get = ctl_commands.add_parser("get", parents=[options], help="jobs of all three kinds, phase and node counts")
    get.add_argument("kind", nargs="?", help="only this kind (nodeupgradejob, imageprepulljob, configupdatejob)")
    get.set_defaults(handler=_ctl_get)
    watch = ctl_commands.add_parser(
        "watch", parents=[options], help="follow jobs until final: exit 0 if all Completed, 1 otherwise"
    )
    watch.add_argument("jobs", nargs="+", metavar="JOB", help="NAME or KIND/NAME")
    watch.set_defaults(handler=_ctl_watch)
    describe = ctl_commands.add_parser("describe", parents=[options], help="a job's nodes and latest Events")
    describe.add_argument("job", metavar="JOB", help="NAME or KIND/NAME")
    describe.set_defaults(handler=_ctl_describe)
    confirm = ctl_commands.add_parser(
        "confirm", parents=[options], help="release nodes paused at WaitingConfirmation (from the cloud)"
    )
    confirm.add_argument("job", metavar="JOB", help="NAME or nodeupgradejob/NAME")
    confirm.add_argument("nodes", nargs="*", metavar="NODE")
    confirm.add_argument("--all", action="store_true", help="every node of the job")
    confirm.set_defaults(handler=_ctl_confirm)
    nodes = ctl_commands.add_parser("nodes", parents=[options], help="edges: hub, agent version, connected")
    nodes.set_defaults(handler=_ctl_nodes)


def main(argv: Sequence[str]) -> int:
    """Run the command ``argv`` names (``argv[0]`` is one of :data:`COMMANDS`)."""
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
