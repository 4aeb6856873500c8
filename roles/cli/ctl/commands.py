"""``nodetaskd ctl``'s subcommands: their arguments, and what each prints (a table, or JSON or YAML).

Exit status as for every command (``roles.cli.commands``); ``ctl watch`` exits 0 when every job
Completed and 1 when one ended in Failure or was deleted.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Final

from roles.cli.parsing import EXIT_USAGE, Parser, fail
from roles.cli.with_api import api_errors, namespace_of, with_kube

__all__ = ["add_ctl_parsers", "add_namespace"]

PHASES = ("Pending", "InProgress", "Successful", "Failure", "Unknown")
"""A node's phases in a job's status, as ``describe --phase`` takes them (in any case)."""
DIAGNOSIS_NAMESPACE_HELP: Final = "the Diagnoses' namespace (default: the kubeconfig context's, else default)"


def _phase(value: str) -> str:
    for phase in PHASES:
        if phase.lower() == value.lower():
            return phase
    raise argparse.ArgumentTypeError(f"{value!r} is not a node phase: one of {', '.join(PHASES)}")


def _diagnosis_name(text: str) -> str | None:
    """The name in ``diagnosis/NAME`` (any of the kind's names), None for a job's ``NAME`` or ``KIND/NAME``."""
    from roles.cli.ctl.diagnosis_views import is_diagnosis_kind

    kind, sep, name = text.rpartition("/")
    return name if sep and is_diagnosis_kind(kind) else None


@api_errors
def _ctl_get(args: argparse.Namespace) -> int:
    from roles.cli.ctl import fetch, text
    from roles.cli.ctl.diagnosis_views import is_diagnosis_kind
    from roles.cli.ctl.views import find_kind
    from schemas.kinds import KINDS

    if args.kind and is_diagnosis_kind(args.kind):
        return _get_diagnoses(args)
    if args.all_namespaces:
        return fail("-A applies to Diagnoses: node jobs belong to no namespace", EXIT_USAGE)

    kinds = (find_kind(args.kind),) if args.kind else KINDS
    if args.output in ("json", "yaml"):  # the API objects, as kubectl prints them
        listed = with_kube(
            args,
            lambda kube: fetch.job_objects(
                kube, kinds, selector=args.selector, managed_fields=args.show_managed_fields
            ),
        )
        sys.stdout.write(text.encode(listed, args.output))
        return 0
    found = with_kube(args, lambda kube: fetch.jobs(kube, kinds, selector=args.selector))
    if args.output == "name":
        sys.stdout.write(text.job_names(found))
    elif found:
        now = datetime.now(UTC)
        sys.stdout.write(text.jobs_table(found, now=now, headers=not args.no_headers, wide=args.output == "wide"))
    else:
        sys.stderr.write("no node jobs\n")
    return 0


def _get_diagnoses(args: argparse.Namespace) -> int:
    from roles.cli.ctl import diagnosis_fetch, diagnosis_text, text

    namespace = "" if args.all_namespaces else namespace_of(args)
    if args.output in ("json", "yaml"):
        listed = with_kube(
            args,
            lambda kube: diagnosis_fetch.diagnosis_objects(
                kube, namespace=namespace, selector=args.selector, managed_fields=args.show_managed_fields
            ),
        )
        sys.stdout.write(text.encode(listed, args.output))
        return 0
    found = with_kube(args, lambda kube: diagnosis_fetch.diagnoses(kube, namespace=namespace, selector=args.selector))
    if args.output == "name":
        sys.stdout.write(diagnosis_text.diagnosis_names(found))
    elif found:
        table = diagnosis_text.diagnoses_table(
            found,
            now=datetime.now(UTC),
            headers=not args.no_headers,
            wide=args.output == "wide",
            namespaces=args.all_namespaces,
        )
        sys.stdout.write(table)
    else:
        sys.stderr.write(f"no Diagnoses in namespace {namespace}\n" if namespace else "no Diagnoses\n")
    return 0


def _describe_diagnosis(args: argparse.Namespace, name: str) -> int:
    from roles.cli.ctl import diagnosis_fetch, diagnosis_text, text

    if args.phase:
        return fail("--phase applies to a job's nodes: a Diagnosis shows its failed Tasks", EXIT_USAGE)
    namespace = namespace_of(args)
    found = with_kube(args, lambda kube: diagnosis_fetch.describe_diagnosis(kube, name, namespace=namespace))
    if args.output != "table":
        document = {
            "diagnosis": found.diagnosis,
            "paths": found.paths,
            "tasks": found.counts,
            "failedTasks": found.tasks,
            "events": found.events,
        }
        sys.stdout.write(text.encode(document, args.output))
    else:
        sys.stdout.write(
            diagnosis_text.describe_diagnosis_text(
                found.diagnosis, found.paths, found.counts, found.tasks, found.events, now=datetime.now(UTC)
            )
        )
    return 0


@api_errors
def _ctl_describe(args: argparse.Namespace) -> int:
    from roles.cli.ctl import fetch, text

    name = _diagnosis_name(args.job)
    if name is not None:
        return _describe_diagnosis(args, name)

    found = with_kube(args, lambda kube: fetch.describe(kube, args.job))
    phases = {p.lower() for p in args.phase}
    nodes = [n for n in found.nodes if n.phase.lower() in phases] if phases else found.nodes
    if args.output != "table":
        document = {"job": found.job, "nodes": nodes, "events": found.events}
        sys.stdout.write(text.encode(document, args.output))
    else:
        only = tuple(p for p in PHASES if p.lower() in phases)
        sys.stdout.write(text.describe_text(found.job, nodes, found.events, now=datetime.now(UTC), only=only))
    return 0


@api_errors
def _ctl_confirm(args: argparse.Namespace) -> int:
    from roles.cli.ctl import fetch, text

    done = with_kube(args, lambda kube: fetch.confirm(kube, args.job, tuple(args.nodes), every=args.all))
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


@api_errors
def _ctl_retry(args: argparse.Namespace) -> int:
    from roles.cli.ctl import fetch, text

    done = with_kube(args, lambda kube: fetch.retry(kube, args.job, keep_confirmations=args.keep_confirmations))
    if args.output != "table":
        document = {
            "job": done.job,
            "retry": done.value,
            "requested": done.requested,
            "nodes": done.nodes,
            "clearedConfirm": done.cleared_confirm,
        }
        sys.stdout.write(text.encode(document, args.output))
        return 0
    if not done.requested:
        sys.stdout.write(f"{done.job}: retry {done.value} is asked for already; the controller has not taken it yet\n")
        return 0
    count = f"{len(done.nodes)} node{'' if len(done.nodes) == 1 else 's'}"
    sys.stdout.write(f"{done.job}: retry {done.value} asked for; {count} run again: {', '.join(done.nodes)}\n")
    if done.cleared_confirm:
        sys.stdout.write(
            f"confirm annotation {done.cleared_confirm} taken away: the retried nodes wait to be confirmed again\n"
        )
    return 0


@api_errors
def _ctl_nodes(args: argparse.Namespace) -> int:
    from roles.cli.ctl import fetch, text

    rows = with_kube(args, fetch.edges)
    if args.output != "table":
        sys.stdout.write(text.encode(rows, args.output))
    elif rows:
        sys.stdout.write(text.edges_table(rows))
    else:
        sys.stderr.write("no edge Nodes (label node-role.kubernetes.io/edge)\n")
    return 0


@api_errors
def _ctl_watch(args: argparse.Namespace) -> int:
    if args.output == "yaml":
        return fail("ctl watch prints a table, or a JSON line per change with -o json", EXIT_USAGE)
    names = [_diagnosis_name(text) for text in args.jobs]
    if any(name is not None for name in names):
        if not all(names):
            return fail("ctl watch follows node jobs or Diagnoses, not both at once", EXIT_USAGE)
        return _watch_diagnoses(args, [name for name in names if name])
    return _watch_jobs(args)


def _watch_jobs(args: argparse.Namespace) -> int:
    from roles.cli.ctl.watch import JsonLines, PlainLines, Presenter, watch

    if args.output == "json":
        return with_kube(args, lambda kube: watch(kube, args.jobs, JsonLines(sys.stdout)))
    if not sys.stdout.isatty():
        return with_kube(args, lambda kube: watch(kube, args.jobs, PlainLines(sys.stdout)))
    try:
        from roles.cli.ctl.live import LiveView  # rich comes with the ctl extra only
    except ModuleNotFoundError:
        sys.stderr.write("(a line per change: the live view needs rich, pip install 'nodetaskd[ctl]')\n")
        return with_kube(args, lambda kube: watch(kube, args.jobs, PlainLines(sys.stdout)))
    with LiveView() as view:
        presenter: Presenter = view
        return with_kube(args, lambda kube: watch(kube, args.jobs, presenter))


def _watch_diagnoses(args: argparse.Namespace, names: list[str]) -> int:
    from roles.cli.ctl.diagnosis_watch import DiagnosisLines, watch_diagnoses

    lines = DiagnosisLines(sys.stdout, json=args.output == "json")
    namespace = namespace_of(args)
    return with_kube(args, lambda kube: watch_diagnoses(kube, names, namespace=namespace, lines=lines))


def add_namespace(parser: argparse.ArgumentParser, *, help: str) -> None:
    """``-n/--namespace`` after a command; absent there, the value given before the command stays."""
    parser.add_argument("-n", "--namespace", default=argparse.SUPPRESS, help=help)


def add_ctl_parsers(commands: argparse._SubParsersAction[Parser], kube: Parser, *, help: str) -> None:
    """``ctl`` and its subcommands, each taking ``kube``'s options."""
    ctl = commands.add_parser("ctl", help=help)
    options = Parser(add_help=False, parents=[kube])
    options.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    add_namespace(options, help=DIAGNOSIS_NAMESPACE_HELP)
    ctl_commands = ctl.add_subparsers(dest="action", required=True, parser_class=Parser)
    get = ctl_commands.add_parser("get", parents=[kube], help="jobs (phase, node counts), or Diagnoses: get diagnosis")
    get.add_argument(
        "kind",
        nargs="?",
        help="only this kind (nodeupgradejob, imageprepulljob, configupdatejob), or diagnosis (KubeDiag's Diagnoses)",
    )
    add_namespace(get, help=DIAGNOSIS_NAMESPACE_HELP)
    get.add_argument(
        "-A", "--all-namespaces", action="store_true", help="Diagnoses of every namespace, with a NAMESPACE column"
    )
    get.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "name", "json", "yaml"),
        default="table",
        help="wide: also what each job does and its reason; name: KIND.GROUP/NAME; json, yaml: the API objects",
    )
    get.add_argument("-l", "--selector", default="", help="only jobs with these labels (kubectl's label selector)")
    get.add_argument("--no-headers", action="store_true", help="the table without its header line")
    get.add_argument("--show-managed-fields", action="store_true", help="with -o json|yaml, keep managedFields")
    get.set_defaults(handler=_ctl_get)
    watch = ctl_commands.add_parser(
        "watch", parents=[options], help="follow jobs until final: exit 0 if all Completed, 1 otherwise"
    )
    watch.add_argument("jobs", nargs="+", metavar="JOB", help="NAME or KIND/NAME of jobs, or diagnosis/NAME")
    watch.set_defaults(handler=_ctl_watch)
    describe = ctl_commands.add_parser(
        "describe",
        parents=[options],
        help="a job's nodes and latest Events; a Diagnosis's paths, failed Tasks and Events",
    )
    describe.add_argument("job", metavar="JOB", help="NAME or KIND/NAME of a job, or diagnosis/NAME")
    describe.add_argument(
        "--phase",
        action="append",
        default=[],
        type=_phase,
        metavar="PHASE",
        help=f"only the nodes in this phase (repeatable): {', '.join(PHASES)}",
    )
    describe.set_defaults(handler=_ctl_describe)
    confirm = ctl_commands.add_parser(
        "confirm", parents=[options], help="release nodes paused at WaitingConfirmation (from the cloud)"
    )
    confirm.add_argument("job", metavar="JOB", help="NAME or nodeupgradejob/NAME")
    confirm.add_argument("nodes", nargs="*", metavar="NODE")
    confirm.add_argument("--all", action="store_true", help="every node of the job")
    confirm.set_defaults(handler=_ctl_confirm)
    retry = ctl_commands.add_parser(
        "retry", parents=[options], help="run a finished job's failed nodes again (its retry annotation)"
    )
    retry.add_argument("job", metavar="JOB", help="NAME or KIND/NAME")
    retry.add_argument(
        "--keep-confirmations",
        action="store_true",
        help="keep the confirm annotation: the nodes it names are released at once on their next attempt",
    )
    retry.set_defaults(handler=_ctl_retry)
    nodes = ctl_commands.add_parser("nodes", parents=[options], help="edges: hub, agent version, connected")
    nodes.set_defaults(handler=_ctl_nodes)
