"""NodeUpgradeJob with ``component: kubelet``: the node's kubelet upgraded, and rolled back if it is not healthy.

``Check (-> WaitingConfirmation) -> BackUp -> Upgrade (-fail-> RollBack)``, the agent's own flow:

* Check refuses when ``kubelet.binary`` is not set (kubelet upgrades are off by default), when the job's
  version is older than the running kubelet's unless ``allowDowngrade``, and when the artifact
  ``{image}:{version}`` is missing or its digest is not ``imageDigestGatter``'s;
* BackUp copies the running kubelet into ``<dataDir>/kubelet/backup/<version>/kubelet`` and reports
  ``",<version>"``;
* Upgrade installs the artifact in ``<dataDir>/kubelet/versions/<version>/``, checks that its kubelet says
  that version, replaces ``kubelet.binary`` with it (one rename: never a half-written kubelet), restarts the
  kubelet with ``kubelet.restartCommand`` and waits ``kubelet.healthDeadline`` for ``healthz`` and a Ready
  Node posted at the new version; it reports ``"from,to"``;
* RollBack puts the backup back the same way, restarts it and waits for it likewise; it reports ``"to,from"``
  and why the upgrade failed, and the node ends as Failure with that reason.

The containers keep running across a kubelet restart. Progress is the store fact ``kubelet_upgrade/<task
key>``, so an action re-run after the agent's own restart carries on: it swaps the same file again and
judges the kubelet again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import anyio.to_thread
import msgspec

from roles.common.config import EdgeConfig
from roles.common.edge_config import KubeletConfig
from roles.common.files import copy_atomically
from roles.edge.context import Outcome, TaskContext
from roles.edge.kubelet import probe
from roles.edge.kubelet.settings import kubelet_settings
from roles.edge.upgrade import artifact
from schemas.version_rule import precedence

__all__ = ["back_up", "check", "roll_back", "upgrade"]

KUBELET_DIR: Final = "kubelet"
EXECUTABLE: Final = 0o755


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


async def _resolve(ctx: TaskContext, cfg: EdgeConfig) -> tuple[artifact.Resolved | None, str]:
    image = ctx.spec.image or cfg.kubelet.upgrade_image
    if not image:
        return None, "no kubelet upgrade image: spec.image is empty and kubelet.upgradeImage is not configured"
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
        older = precedence(wanted) < precedence(running)
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
    resolved, problem = await _resolve(ctx, cfg)
    if resolved is None:
        return None, problem
    try:
        tree = await artifact.install(resolved, ctx.data_dir / KUBELET_DIR / "versions", to, required=("kubelet",))
    except (artifact.ArtifactError, OSError) as exc:
        return None, f"cannot install {resolved.ref}: {exc}"
    found, problem = await probe.binary_version(tree / "kubelet")
    if problem or found != to:
        return None, problem or f"the artifact's kubelet says it is {found}, not {to}"
    return tree / "kubelet", ""


async def upgrade(ctx: TaskContext) -> Outcome:
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is None:
        return Outcome(False, "the kubelet was not backed up: BackUp did not run for this task")
    to = progress.to_version
    if progress.stage == "healthy" or progress.from_version == to:
        return Outcome(True, extend=f"{progress.from_version},{to}")
    cfg, problem = await kubelet_settings(ctx)
    if cfg is not None and progress.stage == "backed_up":
        new, problem = await _install(ctx, cfg, to)
        if new is not None:
            # Recorded before the swap: a re-run after a crash swaps again rather than trusting the old binary.
            progress = msgspec.structs.replace(progress, stage="swapped")
            await ctx.store.set_fact(_fact(ctx), progress)
            problem = await _swap_and_prove(ctx, cfg.kubelet, new, to)
    elif cfg is not None:
        problem = await probe.restart_and_prove(cfg.kubelet, ctx.read_node, to)
    if problem:
        await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, failure=problem))
        return Outcome(False, problem)
    await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, stage="healthy"))
    return Outcome(True, extend=f"{progress.from_version},{to}")


async def roll_back(ctx: TaskContext) -> Outcome:
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is None:
        return Outcome(True, "nothing was changed")
    back, to = progress.from_version, progress.to_version
    why = progress.failure or "it was not healthy"
    if progress.stage == "backed_up":
        return Outcome(True, f"kubelet {to} was never installed: {why}", extend=f"{to},{back}")
    if progress.stage == "rolled_back":
        return Outcome(True, f"kubelet {back} runs again, {to} failed: {why}", extend=f"{to},{back}")
    cfg, problem = await kubelet_settings(ctx)
    if cfg is None:
        return Outcome(False, f"cannot roll the kubelet back to {back}: {problem}")
    problem = await _swap_and_prove(ctx, cfg.kubelet, _backup(ctx, back), back)
    if problem:
        return Outcome(False, f"kubelet {to} failed ({why}) and its rollback to {back} failed too: {problem}")
    await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, stage="rolled_back"))
    return Outcome(True, f"kubelet {back} runs again, {to} failed: {why}", extend=f"{to},{back}")
