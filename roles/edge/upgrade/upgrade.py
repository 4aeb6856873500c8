"""NodeUpgradeJob on the device: the agent upgrades itself, and is rolled back if the new version is unhealthy.

``Check (-> WaitingConfirmation) -> BackUp -> Upgrade (-fail-> RollBack)``, under the launcher
(:mod:`roles.edge.launcher.launcher`), which is what restarts the agent onto another version:

* Check (in :mod:`roles.edge.actions`) also finds the artifact ``{image}:{version}`` in its
  registry and checks its digest against ``imageDigestGatter`` (:func:`find_artifact`);
* BackUp copies the running version's identity, the config file and a consistent snapshot of the
  store into ``<dataDir>/backup/<version>/`` and reports ``",<version>"`` as KubeEdge does;
* Upgrade installs the new version beside the old one (``<dataDir>/versions/<v>/``), records the
  store fact ``node_upgrade/<job uid>`` and the launcher's marker (stage ``switched``), points
  ``<dataDir>/current`` at it and asks for a restart. The new process resumes Upgrade: it checks
  its health (a hub session within ``upgradeHealthDeadline``), marks itself healthy and reports
  ``"from,to"``. If it never gets there - it crashes at start, cannot reach a hub, or gives up - the
  launcher points ``current`` back and starts the previous version, whose resumed Upgrade fails
  with the launcher's reason; RollBack then restores the config file and reports ``"to,from"``.

Every step can be cut short by the agent's own restart, so each is idempotent: a step re-run
after a restart finds its progress in the store fact and the marker and carries on from there.

Limit: an artifact holds only this project's packages; the new version runs with the same
interpreter and virtualenv, so its third-party dependencies must be the ones already installed.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio.to_thread
import msgspec

from roles.common.config import ConfigError, EdgeConfig, load_config
from roles.common.restart import SUPERVISOR_ENV, RestartRequested
from roles.edge.context import Outcome, TaskContext
from roles.edge.upgrade.marker import (
    MarkerState,
    UpgradeMarker,
    current_target,
    read_marker,
    switch_current,
    write_marker,
)

if TYPE_CHECKING:
    from roles.edge.upgrade import artifact

__all__ = ["back_up", "find_artifact", "roll_back", "supervised", "upgrade"]

VERSIONS_DIR: Final = "versions"
BACKUP_DIR: Final = "backup"


def supervised() -> bool:
    """Whether this agent runs under the launcher, the only setup in which it can restart onto another version."""
    return os.environ.get(SUPERVISOR_ENV) == "launcher"


class _Progress(msgspec.Struct, frozen=True, kw_only=True):
    stage: str
    """``switched``: ``current`` points at the new version; ``healthy``: it passed its health check;
    ``rolled_back``: the previous version runs again; ``restarting``: RollBack restarts onto it."""
    from_version: str
    to_version: str
    previous: str


class _Options(msgspec.Struct, frozen=True):
    image: str
    insecure: tuple[str, ...]
    deadline: float


def _fact(ctx: TaskContext) -> str:
    return f"node_upgrade/{ctx.task.key}"


def _options(ctx: TaskContext) -> _Options:
    # Read when the action runs, so a config update of these options applies to the next upgrade.
    cfg = load_config("edge", ctx.config_file, {}) if ctx.config_file is not None else EdgeConfig()
    assert isinstance(cfg, EdgeConfig)
    return _Options(image=cfg.upgrade_image, insecure=cfg.insecure_registries, deadline=cfg.upgrade_health_deadline)


async def _resolve(ctx: TaskContext) -> tuple[artifact.Resolved | None, _Options | None, str]:
    # The registry client (urllib, tarfile...) is loaded by the first upgrade, not at start.
    from roles.edge.upgrade import artifact  # noqa: PLC0415 (deferred on purpose)

    try:
        options = await anyio.to_thread.run_sync(_options, ctx)
    except ConfigError as exc:
        return None, None, f"cannot read the agent's configuration: {exc}"
    image = ctx.spec.image or options.image
    if not image:
        return None, options, "no upgrade image: spec.image is empty and upgradeImage is not configured on this node"
    try:
        resolved = await artifact.resolve(
            image, ctx.spec.version, insecure=options.insecure, digests=ctx.spec.image_digest_gatter
        )
    except artifact.ArtifactError as exc:
        return None, options, str(exc)
    return resolved, options, ""


async def find_artifact(ctx: TaskContext) -> Outcome | None:
    """Check's part: a failed Outcome naming the problem when the artifact is missing or does not verify."""
    resolved, _, problem = await _resolve(ctx)
    return Outcome(False, problem) if resolved is None else None


# -------------------------------------------------------------------------------------------- BackUp


def _snapshot_store(source: Path, target: Path) -> None:
    # The backup API copies a consistent state even while the agent's own connection writes.
    src = sqlite3.connect(source, timeout=5.0)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()


def _back_up(ctx: TaskContext) -> Path:
    root = ctx.data_dir / BACKUP_DIR
    target = root / ctx.version
    work = root / f".{ctx.version}.tmp"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / "VERSION").write_text(f"{ctx.version}\n")
    (work / "current").write_text(f"{current_target(ctx.data_dir)}\n")
    if ctx.config_file is not None:
        shutil.copy2(ctx.config_file, work / "config.yaml")
    _snapshot_store(ctx.store.path, work / "store.sqlite")
    if target.exists():
        shutil.rmtree(target)
    work.rename(target)
    return target


async def back_up(ctx: TaskContext) -> Outcome:
    try:
        await anyio.to_thread.run_sync(_back_up, ctx)
    except (OSError, sqlite3.Error) as exc:
        return Outcome(False, f"cannot back up nodetaskd {ctx.version} into {ctx.data_dir / BACKUP_DIR}: {exc}")
    return Outcome(True, extend=f",{ctx.version}")


# ------------------------------------------------------------------------------------------- Upgrade


def _switch(data_dir: Path, marker: UpgradeMarker) -> None:
    # The marker first: a launcher that sees the new version start always knows it is on probation.
    write_marker(data_dir, marker)
    switch_current(data_dir, f"{VERSIONS_DIR}/{marker.to_version}")


async def upgrade(ctx: TaskContext) -> Outcome:
    to = ctx.spec.version
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is None:
        if to == ctx.version:
            return Outcome(True, extend=f"{to},{to}")  # nothing to install; no restart needed
        return await _install_and_switch(ctx)
    found = await anyio.to_thread.run_sync(read_marker, ctx.data_dir)
    marker = found if found is not None and found.job_uid == ctx.task.key else None
    if progress.stage == "healthy":
        return Outcome(True, extend=f"{progress.from_version},{to}")
    if progress.stage != "switched":
        return Outcome(False, _rolled_back_reason(progress, marker))
    if ctx.version == to:
        return await _on_probation(ctx, progress, marker)
    if marker is not None and marker.state is MarkerState.ROLLED_BACK:
        await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, stage="rolled_back"))
        return Outcome(False, _rolled_back_reason(progress, marker))
    # Still the previous version with no verdict: the agent stopped between recording and switching.
    deadline = marker.deadline_s if marker is not None else (await anyio.to_thread.run_sync(_options, ctx)).deadline
    await anyio.to_thread.run_sync(_switch, ctx.data_dir, _marker(ctx, progress, deadline))
    raise RestartRequested(f"upgrading to {to}")


def _marker(ctx: TaskContext, progress: _Progress, deadline: float) -> UpgradeMarker:
    return UpgradeMarker(
        job_uid=ctx.task.key,
        from_version=progress.from_version,
        to_version=progress.to_version,
        previous=progress.previous,
        state=MarkerState.SWITCHED,
        deadline_s=deadline,
    )


async def _install_and_switch(ctx: TaskContext) -> Outcome:
    """The first run of Upgrade: install beside the running version, record, switch, restart."""
    to = ctx.spec.version
    from roles.edge.upgrade import artifact  # noqa: PLC0415 (deferred on purpose, see _resolve)

    resolved, options, problem = await _resolve(ctx)
    if resolved is None or options is None:
        return Outcome(False, problem)
    try:
        await artifact.install(resolved, ctx.data_dir / VERSIONS_DIR, to)
    except (artifact.ArtifactError, OSError) as exc:
        return Outcome(False, f"cannot install {resolved.ref}: {exc}")
    previous = await anyio.to_thread.run_sync(current_target, ctx.data_dir)
    progress = _Progress(stage="switched", from_version=ctx.version, to_version=to, previous=previous)
    # Recorded before the switch: whichever version starts next finds the upgrade in progress.
    await ctx.store.set_fact(_fact(ctx), progress)
    await anyio.to_thread.run_sync(_switch, ctx.data_dir, _marker(ctx, progress, options.deadline))
    raise RestartRequested(f"upgrading to {to}")


def _rolled_back_reason(progress: _Progress, marker: UpgradeMarker | None) -> str:
    why = marker.reason if marker is not None and marker.reason else "it was not healthy"
    return f"nodetaskd {progress.to_version} was rolled back to {progress.from_version}: {why}"


async def _on_probation(ctx: TaskContext, progress: _Progress, marker: UpgradeMarker | None) -> Outcome:
    """The new version, restarted: keep it if it reaches a hub in time, else ask the launcher to roll back."""
    assert ctx.wait_connected is not None
    if marker is not None and marker.state is MarkerState.ROLLED_BACK:
        # The launcher decided, but stopped before pointing `current` back: finish its work.
        await anyio.to_thread.run_sync(switch_current, ctx.data_dir, progress.previous)
        raise RestartRequested(f"{progress.to_version} was rolled back")
    if marker is None:
        # The marker was lost: put the probation back on record before judging this version.
        options = await anyio.to_thread.run_sync(_options, ctx)
        marker = _marker(ctx, progress, options.deadline)
        await anyio.to_thread.run_sync(write_marker, ctx.data_dir, marker)
    if marker.state is not MarkerState.HEALTHY:
        if not await ctx.wait_connected(marker.deadline_s):
            reason = f"nodetaskd {progress.to_version} did not reach a hub within {marker.deadline_s:g}s"
            unhealthy = msgspec.structs.replace(marker, state=MarkerState.UNHEALTHY, reason=reason)
            await anyio.to_thread.run_sync(write_marker, ctx.data_dir, unhealthy)
            raise RestartRequested(reason)
        healthy = msgspec.structs.replace(marker, state=MarkerState.HEALTHY)
        await anyio.to_thread.run_sync(write_marker, ctx.data_dir, healthy)
    await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, stage="healthy"))
    return Outcome(True, extend=f"{progress.from_version},{progress.to_version}")


# ------------------------------------------------------------------------------------------ RollBack


def _restore_config(ctx: TaskContext, version: str) -> None:
    saved = ctx.data_dir / BACKUP_DIR / version / "config.yaml"
    if ctx.config_file is None or not saved.is_file():
        return
    if saved.read_bytes() != ctx.config_file.read_bytes():
        shutil.copy2(saved, ctx.config_file)


async def roll_back(ctx: TaskContext) -> Outcome:
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is None:
        # Upgrade failed before anything was switched: the installed version never changed.
        return Outcome(True, extend=f",{ctx.version}")
    if ctx.version == progress.to_version and progress.stage in ("switched", "healthy"):
        # Running the new version: point back at the previous one and restart onto it; its RollBack reports.
        marker = UpgradeMarker(
            job_uid=ctx.task.key,
            from_version=progress.from_version,
            to_version=progress.to_version,
            previous=progress.previous,
            state=MarkerState.ROLLED_BACK,
            deadline_s=0.0,
            reason="rolled back by the RollBack action",
        )
        await anyio.to_thread.run_sync(write_marker, ctx.data_dir, marker)
        await anyio.to_thread.run_sync(switch_current, ctx.data_dir, progress.previous)
        await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, stage="restarting"))
        raise RestartRequested(f"rolling back to {progress.from_version}")
    try:
        await anyio.to_thread.run_sync(_restore_config, ctx, progress.from_version)
    except OSError as exc:
        return Outcome(False, f"cannot restore the configuration of {progress.from_version}: {exc}")
    await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, stage="rolled_back"))
    return Outcome(True, extend=f"{progress.to_version},{progress.from_version}")
