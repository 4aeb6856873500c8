"""``nodetaskd``: the one binary, started in a role.

    nodetaskd --role=controller|cloud|edge [--config FILE] [flags...]
    nodetaskd --version

Options come from the config file and flags (flags win). Any invalid option ends the process at
once with exit status 2 and a single line on stderr naming what is wrong, except in an edge agent
that a ConfigUpdateJob has just restarted: one that cannot start with the new file puts the
previous one back and restarts onto it (``roles.edge.config_update.pending.restore_after_failed_start``).
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import msgspec
import structlog
import trio

from roles.cli.parsing import EXIT_UNAVAILABLE, EXIT_USAGE, Parser, leaf
from roles.cli.role_options import ROLE_ALIASES, add_role_options
from roles.common.config import ConfigError, EdgeConfig, RoleConfig, load_config
from roles.common.logs import configure_logging
from roles.common.restart import RestartRequested, reexec

CLOUD_EXTRA_MODULES = frozenset({"trio_asyncio", "kubernetes_asyncio", "aiohttp", "prometheus_client"})
"""What the ``cloud`` extra installs (and what it brings), by top-level module."""


ROLE_SUMMARIES = {
    "controller": "the job and diagnosis controllers and the admission webhooks (in the cluster)",
    "cloud": "a cloud hub: the edges' connections (in the cluster; alias cloudhub)",
    "edge": "the agent on a device",
}


def _command_list() -> str:
    """The roles and the commands beside them, a line each, for ``nodetaskd --help``."""
    from roles.cli.commands import SUMMARIES  # here: the commands' module loads when a command runs

    roles = [f"  --role={role:<12}{summary}" for role, summary in ROLE_SUMMARIES.items()]
    commands = [f"  {name:<19}{summary}" for name, summary in sorted(SUMMARIES.items())]
    return "\n".join(
        [
            "roles (a long-running process each):",
            *roles,
            "",
            "commands (nodetaskd COMMAND --help for each one's options):",
            *commands,
        ]
    )


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="nodetaskd",
        description="Run node tasks on fleets of edge nodes.",
        epilog=_command_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_role_options(p)
    return p


def _overrides(role: str, args: argparse.Namespace) -> dict[str, object]:
    common: dict[str, object] = {"logLevel": args.log_level, "logFormat": args.log_format}
    per_role: dict[str, dict[str, object]] = {
        "controller": {
            "kubeconfig": args.kubeconfig,
            "featureGates": [g for gates in args.feature_gates for g in gates.split(",") if g] or None,
        },
        "cloud": {"kubeconfig": args.kubeconfig, "listen": args.listen},
        "edge": {"nodeName": args.node_name, "hubUrls": args.hub_url or None, "dataDir": args.data_dir},
    }
    flags_for_role = {k for r, opts in per_role.items() if r == role for k in opts}
    for other, opts in per_role.items():
        for key, value in opts.items():
            if other != role and key not in flags_for_role and value is not None:
                raise ConfigError(f"--{_flag(key)} does not apply to the {role} role")
    return {**common, **per_role[role]}


def _flag(key: str) -> str:
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in key).replace("hub-urls", "hub-url")


def _runner(role: str) -> Callable[..., Awaitable[None]]:
    # Imported lazily so that a bad flag is reported without loading every role's dependencies.
    if role == "controller":
        from roles.controller.role import run as run_controller

        return run_controller
    if role == "cloud":
        from roles.cloud.role import run as run_cloud

        return run_cloud
    from roles.edge.role import run as run_edge

    return run_edge


async def _serve(
    run: Callable[..., Awaitable[None]],
    cfg: RoleConfig,
    log: structlog.typing.FilteringBoundLogger,
    config_path: Path | None,
) -> None:
    # SIGTERM and SIGINT cancel the role; its task groups unwind and close what they own.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("signal_received", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            await run(cfg, log=log, config_path=config_path)
            nursery.cancel_scope.cancel()


def _confirm(cfg: RoleConfig, job: str) -> int:
    """Ask the running agent, over its control socket, to release ``job``."""
    from roles.edge.control import control_socket

    assert isinstance(cfg, EdgeConfig)
    path = control_socket(Path(cfg.data_dir))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(str(path))
            conn.sendall(f"confirm {job}\n".encode())
            answer = conn.recv(4096).decode(errors="replace").strip()
    except OSError as exc:
        print(f"nodetaskd: error: cannot reach the edge agent at {path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(answer)
    return 0 if answer.startswith("ok") else 1


def _restored_previous_config(role: str, args: argparse.Namespace, reason: str) -> bool:
    """Whether the agent's configuration, just replaced by a ConfigUpdateJob, was put back because the
    agent failed with it (``reason``) before proving it healthy: then it restarts onto the previous one."""
    if role != "edge" or args.config is None or args.confirm is not None or args.check_config:
        return False
    from roles.edge.config_update.pending import restore_after_failed_start

    if not restore_after_failed_start(args.config, reason):
        return False
    print(f"nodetaskd: restarting with the configuration before the update of {args.config}", file=sys.stderr)
    return True


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911 (one exit per way a start can end)
    arguments = list(sys.argv[1:] if argv is None else argv)
    from roles.cli import commands  # beside the roles: edge join|reset, token create, certs create

    if commands.command_index(arguments) is not None:
        return commands.main(arguments)
    args = _parser().parse_args(argv)
    role = ROLE_ALIASES[args.role]
    try:
        cfg = load_config(role, args.config, _overrides(role, args))
    except ConfigError as exc:
        print(f"nodetaskd: error: {exc}", file=sys.stderr)
        if _restored_previous_config(role, args, str(exc)):
            reexec()
        return EXIT_USAGE
    if args.confirm is not None:
        if role != "edge":
            print("nodetaskd: error: --confirm applies to the edge role", file=sys.stderr)
            return EXIT_USAGE
        return _confirm(cfg, args.confirm)
    if args.check_config:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(cfg).decode()) + "\n")
        return 0
    try:
        run = _runner(role)
    except ModuleNotFoundError as exc:
        # A device installs only the base package; the cloud roles need their extra. Any other
        # missing module is a bug or a broken install, and keeps its traceback.
        if role == "edge" or (exc.name or "").partition(".")[0] not in CLOUD_EXTRA_MODULES:
            raise
        print(
            f"nodetaskd: error: the {role} role needs the cloud extra (pip install 'nodetaskd[cloud]'):"
            f" module {exc.name} is not installed",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    log = configure_logging(level=cfg.log_level, fmt=cfg.log_format).bind(role=role)
    status, restart = _run_role(role, run, cfg, log, args)
    if restart:
        reexec()
    return status


class _NeverRaised(Exception):
    """Stands for the kubeconfig error in a role that has no API client (the edge agent)."""


def _kubeconfig_error(role: str) -> type[Exception]:
    if role == "edge":  # a device's base install has no API client to import
        return _NeverRaised
    from roles.kube import KubeconfigError  # the cloud extra, loaded with the role

    return KubeconfigError


def _run_role(
    role: str,
    run: Callable[..., Awaitable[None]],
    cfg: RoleConfig,
    log: structlog.typing.FilteringBoundLogger,
    args: argparse.Namespace,
) -> tuple[int, bool]:
    """Run the role to its end: its exit status, and whether it is to be started again."""
    status = 0
    restart = False
    kubeconfig_error = _kubeconfig_error(role)
    try:
        trio.run(_serve, run, cfg, log, args.config)
    except* RestartRequested as group:
        log.info("restarting", reason=str(leaf(group)))
        restart = True
    except* kubeconfig_error as group:
        # The API server's address and credentials could not be loaded: nothing the role can retry.
        print(f"nodetaskd: error: {leaf(group)}", file=sys.stderr)
        status = EXIT_UNAVAILABLE
    except* ConfigError as group:
        # Settings the role can only check when it starts (a token file, a certificate...).
        print(f"nodetaskd: error: {leaf(group)}", file=sys.stderr)
        status = EXIT_USAGE
        restart = _restored_previous_config(role, args, str(leaf(group)))
    except* NotImplementedError as group:
        print(f"nodetaskd: error: {leaf(group)}", file=sys.stderr)
        status = EXIT_UNAVAILABLE
        restart = _restored_previous_config(role, args, str(leaf(group)))
    except* Exception as group:
        error = leaf(group)
        if not _restored_previous_config(role, args, f"{type(error).__name__}: {error}"):
            raise
        traceback.print_exception(group)
        restart = True
    return status, restart
