"""What the commands that talk to the API server share: the kubeconfig they use, a client, and their errors.

The kubeconfig is ``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``, else the pod's
ServiceAccount; ``--context`` picks one of its contexts instead of its current one. Every error a command meets
through the API becomes one line and an exit status.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from roles.cli.parsing import EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE, fail, leaf

if TYPE_CHECKING:
    from roles.kube import Kube

__all__ = ["api_errors", "kubeconfig_path", "namespace_of", "with_kube"]

SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

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


def namespace_of(args: argparse.Namespace) -> str:
    """The namespace a command acts in, as kubectl picks it: ``-n``, else the kubeconfig context's (``--context``,
    else the current one), else the pod's own in a cluster, else ``default``."""
    given: str | None = getattr(args, "namespace", None)
    if given:
        return given
    path = kubeconfig_path(getattr(args, "kubeconfig", None))
    if not path:
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"
    return context_namespace(path, getattr(args, "context", None) or "") or "default"


def context_namespace(path: str, context: str) -> str:
    """The namespace of the kubeconfig ``path``'s ``context`` (else its current one); empty when it sets none.

    A file that cannot be read is left to the API client, which says what is wrong with it."""
    import yaml

    try:
        document: Any = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ""
    if not isinstance(document, dict):
        return ""
    wanted = context or document.get("current-context") or ""
    for entry in document.get("contexts") or []:
        if isinstance(entry, dict) and entry.get("name") == wanted and isinstance(entry.get("context"), dict):
            namespace = entry["context"].get("namespace")
            return namespace if isinstance(namespace, str) else ""
    return ""


def with_kube(args: argparse.Namespace, work: Callable[[Kube], Awaitable[T]]) -> T:
    """Run ``work`` with an API client of the command's ``--kubeconfig`` and ``--context`` (warnings of the client
    go to stderr)."""
    kubeconfig: str | None = getattr(args, "kubeconfig", None)
    context: str = getattr(args, "context", None) or ""
    # Imported here: the edge commands must not load the cloud extra.
    import trio

    from roles.common.logs import configure_logging
    from roles.kube import open_kube

    log = configure_logging(level="warning", fmt="console")

    async def run() -> T:
        async with open_kube(kubeconfig=kubeconfig_path(kubeconfig), context=context, log=log) as kube:
            return await work(kube)

    return trio.run(run)


def api_errors(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn the errors of commands that use the API into one line and an exit status."""

    def guarded(args: argparse.Namespace) -> int:
        from roles.kube import ApiError, KubeconfigError

        try:
            return run(args)
        except (Exception, BaseExceptionGroup) as raised:
            # Errors raised inside the API client's task groups arrive wrapped in exception groups.
            error = leaf(raised)
            if isinstance(error, KubeconfigError):
                given = kubeconfig_path(getattr(args, "kubeconfig", None))
                hint = "" if given else "; give --kubeconfig, or set $KUBECONFIG"
                return fail(f"{error}{hint}", EXIT_UNAVAILABLE)
            if isinstance(error, ValueError):  # a job that does not fit (CtlError), a bad name or value
                return fail(str(error), EXIT_USAGE)
            if isinstance(error, ApiError):
                return fail(str(error), EXIT_UNAVAILABLE)
            if isinstance(error, OSError):  # writing the token or CA file
                return fail(str(error), EXIT_FAILED)
            raise

    return guarded
