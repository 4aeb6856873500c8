"""ConfigUpdateJob on the device: Check -> BackUp -> Update (-fail-> RollBack) on the agent's own config.

Every step can be interrupted by the agent's own restart, so each is idempotent and keeps its
progress as a store fact (``config_update/<job uid>``):

* Check validates the whole resulting configuration strictly (the role's schema, plus what the
  agent needs to start) before anything is written, and takes the node's exclusive slot;
* BackUp copies the current file into ``<dataDir>/backup/``;
* Update records ``written``, leaves a note beside the file (:func:`pending_path`), replaces the
  file atomically and asks for a restart; the restarted process resumes Update, which now checks
  health (a hub session within ``healthDeadline``). On success it reports Update; otherwise it
  restores the backup and fails, and RollBack restarts once more to run on the restored file, then
  reports. Results are therefore always reported by the process that runs the resulting
  configuration (KubeEdge loses them: #6448).

A restarted agent that cannot even start with the new file (a file it names is gone, a value it
cannot use, any error before it reaches a hub) must not exit for good or crash-loop: the role's
entry point calls :func:`roles.edge.config_update.pending.restore_after_failed_start`, which puts the
backup back, records why in the note and restarts the agent, which then fails Update with that
reason and reports RollBack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio.to_thread
import msgspec

from nodetask import nesting
from roles.common.config import ConfigError, EdgeConfig
from roles.common.files import write_atomically
from roles.common.restart import RestartRequested
from roles.edge.config_update.fields import FieldError, apply_fields
from roles.edge.config_update.pending import Pending, clear_pending, pending_path, read_pending
from roles.edge.context import Outcome, TaskContext, take_exclusive
from roles.edge.settings import settings_of
from schemas.update_fields import key_problem

__all__ = ["back_up", "candidate", "check", "roll_back", "update"]


class _Progress(msgspec.Struct, frozen=True):
    stage: str
    """``written``: the new file is in place; ``restored``: the backup is back; ``restarting``: the
    agent restarts onto the restored file; ``reverted``: the new file failed to start, and this agent
    already runs the restored one."""
    backup: str


def _fact(ctx: TaskContext) -> str:
    return f"config_update/{ctx.task.key}"


def _backup_path(ctx: TaskContext) -> Path:
    return ctx.data_dir / "backup" / f"config-{ctx.task.key}.yaml"


def _load(path: Path) -> dict[str, Any]:
    # load_yaml imports PyYAML on first use, keeping it out of an idle agent's memory.
    document = nesting.load_yaml(path.read_bytes()) or {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path} is not a mapping of options")
    return document


def candidate(ctx: TaskContext) -> tuple[dict[str, Any] | None, str]:
    """The configuration the update would produce, or None and why it is refused."""
    if ctx.config_file is None:
        return None, "this agent runs without a config file (flags only): there is nothing to update"
    # The webhook refuses these keys too, but a job stored while it was down comes here unchecked.
    for key in sorted(ctx.spec.update_fields):
        if problem := key_problem(key, EdgeConfig.UPDATABLE_FIELDS):
            return None, f"updateFields refused: {problem}"
    try:
        current = _load(ctx.config_file)
        updated = apply_fields(current, ctx.spec.update_fields)
    except (OSError, msgspec.DecodeError, ConfigError, FieldError) as exc:
        return None, f"cannot apply updateFields: {exc}"
    try:
        config = msgspec.convert(updated, type=EdgeConfig)
        settings_of(config, config_file=ctx.config_file)
    except (msgspec.ValidationError, ConfigError) as exc:
        return None, f"the updated configuration is invalid: {exc}"
    return updated, ""


def _copy_atomic(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, source.read_bytes())


async def check(ctx: TaskContext) -> Outcome:
    if not ctx.spec.update_fields:
        return Outcome(False, "updateFields is empty")
    _, problem = await anyio.to_thread.run_sync(candidate, ctx)
    if problem:
        return Outcome(False, problem)
    return await take_exclusive(ctx) or Outcome(True)


async def back_up(ctx: TaskContext) -> Outcome:
    assert ctx.config_file is not None  # Check refused the task otherwise
    target = _backup_path(ctx)
    try:
        await anyio.to_thread.run_sync(_copy_atomic, ctx.config_file, target)
    except OSError as exc:
        return Outcome(False, f"cannot back up {ctx.config_file} to {target}: {exc.strerror}")
    return Outcome(True)


async def update(ctx: TaskContext) -> Outcome:
    assert ctx.config_file is not None
    assert ctx.wait_connected is not None
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is None:
        new, problem = await anyio.to_thread.run_sync(candidate, ctx)
        if new is None:
            return Outcome(False, problem)
        backup = str(_backup_path(ctx))
        await ctx.store.set_fact(_fact(ctx), _Progress(stage="written", backup=backup))
        note = msgspec.json.encode(Pending(job_uid=ctx.task.key, backup=backup))
        try:
            await anyio.to_thread.run_sync(write_atomically, pending_path(ctx.config_file), note)
            await anyio.to_thread.run_sync(write_atomically, ctx.config_file, msgspec.yaml.encode(new))
        except OSError as exc:
            await anyio.to_thread.run_sync(clear_pending, ctx.config_file)
            await ctx.store.delete_fact(_fact(ctx))
            return Outcome(False, f"cannot write {exc.filename or ctx.config_file}: {exc.strerror}")
        raise RestartRequested("configuration updated")
    if progress.stage != "written":
        return Outcome(False, "the update was already rolled back")
    pending = await anyio.to_thread.run_sync(read_pending, ctx.config_file)
    if pending is not None and pending.failed:
        # The new file did not start; the entry point put the backup back, and this agent runs it.
        await ctx.store.set_fact(_fact(ctx), _Progress(stage="reverted", backup=progress.backup))
        await anyio.to_thread.run_sync(clear_pending, ctx.config_file)
        return Outcome(
            False,
            f"the agent could not start with the new configuration ({pending.failed}); "
            "the previous configuration was restored",
        )
    # This is the restarted agent, running the new configuration: is it healthy?
    if await ctx.wait_connected(ctx.health_deadline):
        await anyio.to_thread.run_sync(clear_pending, ctx.config_file)
        await ctx.store.delete_fact(_fact(ctx))
        return Outcome(True)
    await anyio.to_thread.run_sync(_copy_atomic, Path(progress.backup), ctx.config_file)
    await anyio.to_thread.run_sync(clear_pending, ctx.config_file)
    await ctx.store.set_fact(_fact(ctx), _Progress(stage="restored", backup=progress.backup))
    return Outcome(
        False,
        f"the agent did not reach a hub within {ctx.health_deadline:g}s with the new configuration; "
        "the previous configuration was restored",
    )


async def roll_back(ctx: TaskContext) -> Outcome:
    assert ctx.config_file is not None
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is not None and progress.stage in ("written", "restored"):
        if progress.stage == "written":
            await anyio.to_thread.run_sync(_copy_atomic, Path(progress.backup), ctx.config_file)
        await ctx.store.set_fact(_fact(ctx), _Progress(stage="restarting", backup=progress.backup))
        raise RestartRequested("configuration rolled back")
    # Restarted onto the restored file, or ``reverted`` (already running it): nothing is left to undo.
    await anyio.to_thread.run_sync(clear_pending, ctx.config_file)
    await ctx.store.delete_fact(_fact(ctx))
    return Outcome(True)
