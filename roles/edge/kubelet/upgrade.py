"""NodeUpgradeJob with ``component: kubelet``: the node's kubelet upgraded, and rolled back if it is not healthy.

``Check (-> WaitingConfirmation) -> BackUp -> Upgrade (-fail-> RollBack)``, the agent's own flow:

* Check refuses when ``kubelet.binary`` is not set (kubelet upgrades are off by default), when the job's
  version is older than the running kubelet's unless ``allowDowngrade``, and when the artifact
  ``{image}:{version}`` is missing or its digest is not ``imageDigestGatter``'s;
* BackUp copies the running kubelet into ``<dataDir>/kubelet/backup/<version>/kubelet`` (unless it already
  runs the job's version) and reports ``",<version>"``; once an upgrade is healthy only that backup stays;
* Upgrade installs the artifact in ``<dataDir>/kubelet/versions/<version>/``, checks that its kubelet says
  that version, replaces ``kubelet.binary`` with it (one rename: never a half-written kubelet), restarts the
  kubelet with ``kubelet.restartCommand`` and waits ``kubelet.healthDeadline`` for ``healthz`` and a Ready
  Node posted at the new version; it reports ``"from,to"``. Failing that, it puts the backup back the same
  way and proves it before it reports. From the swap on it is shielded from a Cancel: a job's timeout waits
  for the verdict and the restore rather than leave a kubelet half-changed. A node already at the version
  installs nothing, but its kubelet must be Ready at it;
* RollBack reports that restore (or does it, when the agent stopped before it could): ``"to,from"`` and why
  the upgrade failed, and the node ends as Failure with that reason.

The kubelet comes only from the device's ``kubelet.upgradeImage`` (``spec.image`` may only repeat it): a job
never chooses where a binary run as root comes from. The containers keep running across a kubelet restart.
Progress is the store fact ``kubelet_upgrade/<task key>``, so an action re-run after the agent's own restart
carries on: it installs and swaps again and judges the kubelet again.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio.to_thread
import msgspec

from roles.common.config import EdgeConfig
from roles.common.edge_config import KubeletConfig
from roles.common.files import copy_atomically
from roles.edge.context import Outcome, TaskContext
from roles.edge.kubelet import probe
from roles.edge.kubelet.settings import kubelet_settings
from schemas.version_rule import precedence

if TYPE_CHECKING:
    from roles.edge.upgrade import artifact

__all__ = ["back_up", "check", "roll_back", "upgrade"]

KUBELET_DIR: Final = "kubelet"
EXECUTABLE: Final = 0o755
RECENT_S: Final = 60.0
"""A node already at the version is healthy if its kubelet posted Ready at it within this many seconds
(the kubelet posts every 10 s)."""


class _Progress(msgspec.Struct, frozen=True, kw_only=True):
    stage: str
    """``backed_up``: the running kubelet is saved; ``swapped``: ``kubelet.binary`` is the new one;
    ``healthy``: it proved itself; ``rolled_back``: the saved one runs again."""
    from_version: str
    to_version: str
    failure: str = ""
    """Why Upgrade failed, for RollBack's report."""


def _fact(ctx: TaskContext) -> str:
    return f"kubelet_upgrade/{ctx.task.key}"


def _backup(ctx: TaskContext, version: str) -> Path:
    return ctx.data_dir / KUBELET_DIR / "backup" / version / "kubelet"


def _image(ctx: TaskContext, cfg: EdgeConfig) -> tuple[str, str]:
    """The repository to take the kubelet from: the device's own ``kubelet.upgradeImage``, which ``spec.image``
    may only repeat. A job never chooses where a binary run as root comes from."""
    allowed = cfg.kubelet.upgrade_image
    if not allowed:
        return "", "kubelet upgrades need kubelet.upgradeImage: the repository this node takes kubelets from"
    from roles.edge.upgrade import artifact  # noqa: PLC0415 (the registry client loads with the first upgrade)

    wanted = ctx.spec.image or allowed
    try:
        same = str(artifact.reference(wanted, ctx.spec.version)) == str(artifact.reference(allowed, ctx.spec.version))
    except artifact.ArtifactError as exc:
        return "", f"spec.image {wanted!r}: {exc}"
    if not same:
        return "", f"spec.image {wanted!r} is not this node's kubelet.upgradeImage {allowed!r} (its only source)"
    return allowed, ""


async def _resolve(ctx: TaskContext, cfg: EdgeConfig) -> tuple[artifact.Resolved | None, str]:
    from roles.edge.upgrade import artifact  # noqa: PLC0415 (deferred on purpose, see _image)

    image, problem = _image(ctx, cfg)
    if not image:
        return None, problem
    try:
        found = await artifact.resolve(
            image, ctx.spec.version, insecure=cfg.insecure_registries, digests=ctx.spec.image_digest_gatter
        )
    except artifact.ArtifactError as exc:
        return None, str(exc)
    return found, ""


async def check(ctx: TaskContext) -> Outcome | None:
    """Check's part for the kubelet: a failed Outcome naming the problem, or None when the upgrade may go on."""
    cfg, problem = await kubelet_settings(ctx)
    if cfg is None:
        return Outcome(False, problem)
    running, problem = await probe.binary_version(Path(cfg.kubelet.binary))
    if problem:
        return Outcome(False, problem)
    wanted = ctx.spec.version
    try:
        # Build metadata (``v1.28.3+k3s1``) has no say in the order.
        older = precedence(wanted) < precedence(running.partition("+")[0])
    except ValueError as exc:
        return Outcome(False, f"cannot compare the running kubelet's version: {exc}")
    if older and not ctx.spec.allow_downgrade:
        return Outcome(False, f"refusing to downgrade the kubelet from {running} to {wanted}: set spec.allowDowngrade")
    if running == wanted:
        return None  # Upgrade has nothing to install
    resolved, problem = await _resolve(ctx, cfg)
    return Outcome(False, problem) if resolved is None else None


async def back_up(ctx: TaskContext) -> Outcome:
    cfg, problem = await kubelet_settings(ctx)
    if cfg is None:
        return Outcome(False, problem)
    binary = Path(cfg.kubelet.binary)
    running, problem = await probe.binary_version(binary)
    if problem:
        return Outcome(False, problem)
    saved = _backup(ctx, running)
    try:
        if running != ctx.spec.version:  # else nothing is swapped, and the backup of the previous kubelet stays
            await anyio.to_thread.run_sync(lambda: saved.parent.mkdir(parents=True, exist_ok=True))
            await anyio.to_thread.run_sync(lambda: copy_atomically(binary, saved, mode=EXECUTABLE))
    except OSError as exc:
        return Outcome(False, f"cannot back up the kubelet {binary} into {saved}: {exc}")
    progress = _Progress(stage="backed_up", from_version=running, to_version=ctx.spec.version)
    await ctx.store.set_fact(_fact(ctx), progress)
    return Outcome(True, extend=f",{running}")


async def _swap_and_prove(ctx: TaskContext, settings: KubeletConfig, source: Path, version: str) -> str:
    """Replace the kubelet with ``source``, restart it and wait for it at ``version``: "" or why it failed."""
    binary = Path(settings.binary)
    try:
        await anyio.to_thread.run_sync(lambda: copy_atomically(source, binary, mode=EXECUTABLE))
    except OSError as exc:
        return f"cannot replace {binary}: {exc}"
    return await probe.restart_and_prove(settings, ctx.read_node, version)


async def _install(ctx: TaskContext, cfg: EdgeConfig, to: str) -> tuple[Path | None, str]:
    """The new kubelet, downloaded, verified and unpacked, that says it is ``to``; or (None, why not)."""
    from roles.edge.upgrade import artifact  # noqa: PLC0415 (deferred on purpose, see _image)

    resolved, problem = await _resolve(ctx, cfg)
    if resolved is None:
        return None, problem
    try:
        tree = await artifact.install(resolved, _versions(ctx), to, required=("kubelet",))
    except (artifact.ArtifactError, OSError) as exc:
        return None, f"cannot install {resolved.ref}: {exc}"
    found, problem = await probe.binary_version(tree / "kubelet")
    if problem or found != to:
        return None, problem or f"the artifact's kubelet says it is {found}, not {to}"
    return tree / "kubelet", ""


def _versions(ctx: TaskContext) -> Path:
    return ctx.data_dir / KUBELET_DIR / "versions"


async def _restore(ctx: TaskContext, settings: KubeletConfig, progress: _Progress) -> _Progress:
    """The backup swapped back in and proven: the progress ``rolled_back``, or still ``swapped`` with both reasons."""
    back, to = progress.from_version, progress.to_version
    problem = await _swap_and_prove(ctx, settings, _backup(ctx, back), back)
    if problem:
        failure = f"kubelet {to} failed ({progress.failure}) and its rollback to {back} failed too: {problem}"
        restored = msgspec.structs.replace(progress, failure=failure)
    else:
        restored = msgspec.structs.replace(progress, stage="rolled_back")
    await ctx.store.set_fact(_fact(ctx), restored)
    return restored


async def _settled(ctx: TaskContext, to: str) -> None:
    # The installed tree was copied over kubelet.binary (or rolled back): 100+ MB no longer needed.
    await anyio.to_thread.run_sync(lambda: shutil.rmtree(_versions(ctx) / to, ignore_errors=True))


async def upgrade(ctx: TaskContext) -> Outcome:
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is None:
        return Outcome(False, "the kubelet was not backed up: BackUp did not run for this task")
    if progress.stage in ("healthy", "rolled_back"):  # decided by an earlier run of this action
        ok = progress.stage == "healthy"
        return Outcome(
            ok, "" if ok else progress.failure, f"{progress.from_version},{progress.to_version}" if ok else ""
        )
    cfg, problem = await kubelet_settings(ctx)
    if cfg is None:
        return await _failed(ctx, progress, problem)
    if progress.from_version == progress.to_version:
        return await _already_at(ctx, cfg.kubelet, progress)
    return await _swap_in(ctx, cfg, progress)


async def _already_at(ctx: TaskContext, settings: KubeletConfig, progress: _Progress) -> Outcome:
    """Nothing to install; but a kubelet that only says the version on disk must also be running it."""
    problem = "this agent cannot read its Node (no cache)"
    if ctx.read_node is not None:
        since = datetime.now(UTC) - timedelta(seconds=RECENT_S)
        problem = await probe.wait_healthy(
            settings.healthz_url,
            ctx.read_node,
            version=progress.to_version,
            since=since,
            within=settings.health_deadline,
        )
    return await _failed(ctx, progress, problem) if problem else await _healthy(ctx, progress)


async def _swap_in(ctx: TaskContext, cfg: EdgeConfig, progress: _Progress) -> Outcome:
    to = progress.to_version
    # Also at ``swapped``: the agent stopped mid-way, so the rename may not have happened; install is idempotent.
    new, problem = await _install(ctx, cfg, to)
    if new is None:
        return await _failed(ctx, progress, problem)
    # Shielded from the swap to the verdict (and the restore it may need): a Cancel, the job's timeout, waits for
    # it rather than leave a kubelet half-changed. Bounded by the restart command's and healthDeadline's bounds.
    with anyio.CancelScope(shield=True):
        progress = msgspec.structs.replace(progress, stage="swapped")
        await ctx.store.set_fact(_fact(ctx), progress)
        problem = await _swap_and_prove(ctx, cfg.kubelet, new, to)
        if not problem:
            return await _healthy(ctx, progress)
        await _restore(ctx, cfg.kubelet, msgspec.structs.replace(progress, failure=problem))
    await _settled(ctx, to)
    return Outcome(False, problem)


async def _healthy(ctx: TaskContext, progress: _Progress) -> Outcome:
    await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, stage="healthy"))
    await _settled(ctx, progress.to_version)
    if progress.from_version != progress.to_version:
        await _keep_one_backup(ctx, progress.from_version)
    return Outcome(True, extend=f"{progress.from_version},{progress.to_version}")


async def _keep_one_backup(ctx: TaskContext, version: str) -> None:
    """Only the backup of the kubelet just replaced stays: each is 100+ MB, and older ones are in the registry."""
    root = _backup(ctx, version).parent.parent

    def prune() -> None:
        for entry in root.iterdir() if root.is_dir() else ():
            if entry.name != version:
                shutil.rmtree(entry, ignore_errors=True)

    await anyio.to_thread.run_sync(prune)


async def _failed(ctx: TaskContext, progress: _Progress, problem: str) -> Outcome:
    await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, failure=problem))
    return Outcome(False, problem)


async def roll_back(ctx: TaskContext) -> Outcome:
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is None:
        return Outcome(True, "the kubelet was not changed (this task has no record of a backup)")
    back, to = progress.from_version, progress.to_version
    why = progress.failure or "it was not healthy"
    if progress.stage == "backed_up":
        return Outcome(True, f"kubelet {to} was never installed: {why}", extend=f"{to},{back}")
    if progress.stage != "rolled_back":
        cfg, problem = await kubelet_settings(ctx)
        if cfg is None:
            return Outcome(False, f"cannot roll the kubelet back to {back}: {problem}")
        with anyio.CancelScope(shield=True):
            progress = await _restore(ctx, cfg.kubelet, progress)
        if progress.stage != "rolled_back":
            return Outcome(False, progress.failure)
    return Outcome(True, f"kubelet {back} runs again, {to} failed: {why}", extend=f"{to},{back}")
