"""The edge agent's supervisor: runs the active version, restarts it, and rolls back a bad upgrade.

    python -m roles.edge.launcher --config /etc/nodetaskd/edge.yaml [--data-dir DIR]

The launcher runs from the base installation (the virtualenv or system package), never from an
installed upgrade, so a broken new version cannot break the code that rolls it back. It starts
``python -P -m roles.cli --role=edge`` with ``PYTHONPATH=<dataDir>/current`` when that link exists
(``-P`` keeps the working directory off ``sys.path``, so ``current`` wins), and tells the agent, via
:data:`roles.common.restart.SUPERVISOR_ENV`, to exit with :data:`roles.common.restart.EXIT_RESTART` instead of
re-executing itself when it wants a restart. Then:

* exit 75 (a restart was asked for: a config update, or the switch to a new version) starts the
  agent again at once, from whatever ``current`` now points at;
* while an upgrade is on probation (the marker ``<dataDir>/upgrade.json`` says ``switched``), the
  new version must mark itself ``healthy`` within the marker's deadline (plus a grace). If it exits
  non-zero three times (:data:`roles.edge.launcher.supervision.MAX_FAILED_STARTS`), marks itself
  ``unhealthy``, or misses the deadline, the launcher points ``current`` back at the previous
  version, marks the upgrade ``rolled_back`` with the reason, and starts the previous version,
  which reports Upgrade failed and RollBack;
* any other crash restarts the agent with capped backoff; a configuration error (exit 2) or a
  clean exit ends the launcher with the same status;
* SIGTERM or SIGINT is forwarded to the agent; the launcher exits 0 once it has stopped.

These decisions are a pure state machine (:mod:`roles.edge.launcher.supervision`); this module runs it.

The marker and the ``current`` link (:mod:`roles.edge.upgrade.marker`) are this module's contract
with :mod:`roles.edge.upgrade.upgrade`; both are written atomically (a temporary name, then ``os.replace``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
import structlog
import trio

from nodetask.backoff import Backoff
from roles.common.config import ConfigError, EdgeConfig, load_config
from roles.common.logs import configure_logging
from roles.common.restart import SUPERVISOR_ENV
from roles.edge.config_update.pending import restore_after_failed_start
from roles.edge.launcher.supervision import (
    DEADLINE_GRACE_S,
    EXIT_USAGE,
    Event,
    Exited,
    Finish,
    Pause,
    Relaunch,
    RollBack,
    Start,
    Starting,
    Supervision,
    decide,
)
from roles.edge.upgrade.marker import (
    CURRENT_LINK,
    MarkerState,
    UpgradeMarker,
    read_marker,
    switch_current,
    write_marker,
)

__all__ = ["agent_command", "agent_environment", "main", "supervise"]

Log = structlog.typing.FilteringBoundLogger

STOP_GRACE_S: Final = 10.0
POLL_S: Final = 0.2
RETRY_S: Final = 0.5
"""The pause before starting a version on probation again after it failed to start."""


# ------------------------------------------------------------------------------------ supervisor


def agent_command(config: Path, extra: Sequence[str] = ()) -> list[str]:
    """The agent's command line under the launcher."""
    return [sys.executable, "-P", "-m", "roles.cli", "--role=edge", f"--config={config}", *extra]


def agent_environment(data_dir: Path) -> dict[str, str]:
    """The launcher's environment, plus the active version on ``PYTHONPATH`` and the supervisor flag."""
    env = dict(os.environ)
    env[SUPERVISOR_ENV] = "launcher"
    current = data_dir / CURRENT_LINK
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if current.exists():
        # The link itself, not its target: an agent re-reading its own files sees the version it runs.
        paths.insert(0, str(current))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


async def _stop(process: anyio.abc.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    with anyio.move_on_after(STOP_GRACE_S, shield=True):
        await process.wait()
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()


async def _roll_back(data_dir: Path, marker: UpgradeMarker, reason: str, log: Log) -> None:
    def undo() -> None:
        switch_current(data_dir, marker.previous)
        rolled = msgspec.structs.replace(marker, state=MarkerState.ROLLED_BACK, reason=reason)
        write_marker(data_dir, rolled)

    await anyio.to_thread.run_sync(undo)
    log.warning(
        "upgrade_rolled_back",
        job_uid=marker.job_uid,
        from_version=marker.to_version,
        to_version=marker.from_version,
        reason=reason,
    )


async def _run_once(command: list[str], data_dir: Path, probation_until: float | None, log: Log) -> int | None:
    """Run the agent once; its exit status, or None if it was stopped for missing its probation's deadline."""
    env = await anyio.to_thread.run_sync(agent_environment, data_dir)
    process = await anyio.open_process(command, env=env, stdin=None, stdout=None, stderr=None)
    log.info("agent_started", pid=process.pid, version_path=env.get("PYTHONPATH", ""))
    try:
        if probation_until is None:
            await process.wait()
            return process.returncode
        while process.returncode is None:
            marker = await anyio.to_thread.run_sync(read_marker, data_dir)
            if marker is None or marker.state is not MarkerState.SWITCHED:
                # Healthy (or gave up): the rest of this run is no longer on probation.
                await process.wait()
                return process.returncode
            if anyio.current_time() >= probation_until:
                log.warning("agent_missed_health_deadline", pid=process.pid)
                await _stop(process)
                return None
            with anyio.move_on_after(POLL_S):
                await process.wait()
        return process.returncode
    finally:
        if process.returncode is None:
            # Cancelled (the launcher is stopping): the agent stops with it.
            await _stop(process)


async def supervise(command: list[str], data_dir: Path, *, log: Log, grace: float = DEADLINE_GRACE_S) -> int:
    """Run the agent (``command``, see :func:`agent_command`) until it ends for good; returns the launcher's
    exit status. ``grace`` is added to a probation's deadline. Cancel to stop (the agent is terminated).

    The decisions are :func:`roles.edge.launcher.supervision.decide`'s; this shell reads the marker, runs the
    agent, waits and rolls back as they say.
    """
    state = Supervision(grace=grace)
    crashes = Backoff(initial=0.5, cap=30.0)
    status: int | None = None
    event: Event = Starting(await anyio.to_thread.run_sync(read_marker, data_dir), anyio.current_time())
    while True:
        state, decision = decide(state, event)
        match decision:
            case Start(until=until):
                status = await _run_once(command, data_dir, until, log)
                log.info("agent_exited", status=status)
                event = Exited(status, await anyio.to_thread.run_sync(read_marker, data_dir))
                continue
            case RollBack(marker=marker, reason=reason):
                await _roll_back(data_dir, marker, reason, log)
            case Relaunch(pause=Pause.NONE):
                crashes.reset()
            case Relaunch(pause=Pause.RETRY):
                await anyio.sleep(RETRY_S)
            case Relaunch(pause=Pause.BACKOFF):
                delay = crashes.delay()
                log.warning("agent_crashed", status=status, restart_in_s=round(delay, 2))
                await anyio.sleep(delay)
            case Finish(status=final):
                return final
        event = Starting(await anyio.to_thread.run_sync(read_marker, data_dir), anyio.current_time())


async def _main(command: list[str], data_dir: Path, log: Log) -> int:
    status = 0
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("signal_received", signal=signal.Signals(signum).name)
                    tg.cancel_scope.cancel()  # the running agent is terminated as its scope unwinds

            async def run() -> None:
                nonlocal status
                status = await supervise(command, data_dir, log=log)
                tg.cancel_scope.cancel()

            tg.start_soon(stop_on_signal)
            tg.start_soon(run)
    return status


def _load(config: Path, data_dir: str | None) -> EdgeConfig:
    """The configuration, or the one before a ConfigUpdateJob replaced it if the new one cannot be loaded
    (the device restarted during the update's probation: the agent then reports it rolled back)."""
    try:
        cfg = load_config("edge", config, {"dataDir": data_dir})
    except ConfigError as exc:
        if not restore_after_failed_start(config, str(exc)):
            raise
        cfg = load_config("edge", config, {"dataDir": data_dir})
    assert isinstance(cfg, EdgeConfig)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nodetaskd-launcher", description="Supervise the nodetaskd edge agent.")
    parser.add_argument("--config", type=Path, required=True, help="the agent's YAML configuration")
    parser.add_argument("--data-dir", help="override the configuration's dataDir (passed on to the agent)")
    args = parser.parse_args(argv)
    try:
        cfg = _load(args.config, args.data_dir)
    except ConfigError as exc:
        print(f"nodetaskd-launcher: error: {exc}", file=sys.stderr)  # noqa: T201
        return EXIT_USAGE
    log = configure_logging(level=cfg.log_level, fmt=cfg.log_format).bind(role="launcher")
    extra = [f"--data-dir={args.data_dir}"] if args.data_dir else []
    command = agent_command(args.config.resolve(), extra)
    return trio.run(_main, command, Path(cfg.data_dir).resolve(), log)
