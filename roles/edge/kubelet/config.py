"""ConfigUpdateJob with ``component: kubelet``: fields of the node's KubeletConfiguration set, the kubelet restarted
and proven, and the previous file put back if it does not come back.

``Check -> BackUp -> Update (-fail-> RollBack)``, the agent's own config update's flow:

* Check refuses unless the device's config names the kubelet (``kubelet.binary``) and its file
  (``kubelet.configFile``), and refuses any field outside :data:`schemas.kubelet_fields.KUBELET_FIELDS` or a
  value not of its KubeletConfiguration type (the webhook's rules: a job stored while it was down comes here
  unchecked);
* BackUp copies the file into ``<dataDir>/kubelet/config-backup/``;
* Update writes the backup with the fields set (JSON stays JSON; YAML is written anew, without its comments)
  in one rename, restarts the kubelet and waits ``kubelet.healthDeadline`` for its healthz and a Ready Node
  posted after the restart; a value the kubelet itself rejects (it exits at start) fails here, and Update
  puts the backup back and proves the kubelet on it before it reports (shielded from a Cancel from the write
  on, so that a job's timeout never leaves a kubelet on a file nobody judged);
* RollBack reports that restore, or does it when the agent stopped before it could; the node ends as Failure
  with what was wrong.

Progress is the store fact ``kubelet_config/<task key>``: a step re-run after the agent's restart writes the
same file again and judges the kubelet again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import anyio.to_thread
import msgspec

from nodetask import nesting
from roles.common.edge_config import KubeletConfig
from roles.common.files import copy_atomically, write_atomically
from roles.edge.context import Outcome, TaskContext, take_exclusive
from roles.edge.kubelet import probe
from roles.edge.kubelet.settings import kubelet_settings
from schemas.kubelet_fields import Value, kubelet_field_problem, kubelet_value

__all__ = ["back_up", "check", "roll_back", "update"]

OFF: Final = (
    "kubelet configuration updates are off on this node: kubelet.binary and kubelet.configFile must both be set"
    " in its configuration"
)
PRIVATE: Final = 0o600


class _Progress(msgspec.Struct, frozen=True, kw_only=True):
    stage: str
    """``backed_up``; ``written``: the file has the fields; ``healthy``; ``rolled_back``: the backup is back."""
    failure: str = ""


def _refusal(settings: KubeletConfig) -> str:
    return "" if settings.enabled and settings.config_file else OFF


def _fact(ctx: TaskContext) -> str:
    return f"kubelet_config/{ctx.task.key}"


def _backup(ctx: TaskContext) -> Path:
    return ctx.data_dir / "kubelet" / "config-backup" / f"{ctx.task.key}.conf"


def _fields(fields: dict[str, str]) -> tuple[dict[str, Value], str]:
    typed: dict[str, Value] = {}
    for key in sorted(fields):
        if problem := kubelet_field_problem(key):
            return {}, f"updateFields refused: {problem}"
        value, problem = kubelet_value(key, fields[key])
        if value is None:
            return {}, f"updateFields refused: {problem}"
        typed[key] = value
    return typed, ""


def _updated(source: Path, fields: dict[str, Value]) -> bytes:
    """``source``'s KubeletConfiguration with ``fields`` set, in the same format. Errors: ValueError, OSError."""
    raw = source.read_bytes()
    try:
        document: Any = json.loads(raw)
        as_json = True
    except ValueError:
        document, as_json = nesting.load_yaml(raw), False
    if not isinstance(document, dict) or document.get("kind") != "KubeletConfiguration":
        raise ValueError(f"{source} is not a KubeletConfiguration")
    document = {**document, **fields}
    return (json.dumps(document, indent=2) + "\n").encode() if as_json else msgspec.yaml.encode(document)


async def check(ctx: TaskContext) -> Outcome:
    cfg, problem = await kubelet_settings(ctx, _refusal)
    if cfg is None:
        return Outcome(False, problem)
    fields, problem = _fields(ctx.spec.update_fields)
    if not fields:
        return Outcome(False, problem or "updateFields is empty")
    try:
        await anyio.to_thread.run_sync(_updated, Path(cfg.kubelet.config_file), fields)
    except (OSError, ValueError) as exc:
        return Outcome(False, f"cannot apply updateFields to kubelet.configFile: {exc}")
    return await take_exclusive(ctx) or Outcome(True)


async def back_up(ctx: TaskContext) -> Outcome:
    cfg, problem = await kubelet_settings(ctx, _refusal)
    if cfg is None:
        return Outcome(False, problem)
    source, target = Path(cfg.kubelet.config_file), _backup(ctx)
    try:
        await anyio.to_thread.run_sync(lambda: target.parent.mkdir(parents=True, exist_ok=True))
        await anyio.to_thread.run_sync(lambda: copy_atomically(source, target, mode=PRIVATE))
    except OSError as exc:
        return Outcome(False, f"cannot back up {source} into {target}: {exc}")
    await ctx.store.set_fact(_fact(ctx), _Progress(stage="backed_up"))
    return Outcome(True)


async def _prove(ctx: TaskContext, settings: KubeletConfig) -> str:
    version, problem = await probe.binary_version(Path(settings.binary))
    return problem or await probe.restart_and_prove(settings, ctx.read_node, version)


async def update(ctx: TaskContext) -> Outcome:
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is None:
        return Outcome(False, "the kubelet's configuration was not backed up: BackUp did not run for this task")
    if progress.stage in ("healthy", "rolled_back"):  # decided by an earlier run of this action
        return Outcome(progress.stage == "healthy", progress.failure)
    cfg, problem = await kubelet_settings(ctx, _refusal)
    fields, refused = _fields(ctx.spec.update_fields)
    problem = problem or refused
    if cfg is not None and not problem:
        target = Path(cfg.kubelet.config_file)
        # Shielded from the write to the verdict and the restore it may need: a Cancel (the job's timeout) waits
        # rather than leave the kubelet on a file nobody judged.
        with anyio.CancelScope(shield=True):
            try:
                # From the backup: a re-run after the agent's restart writes the same file again.
                new = await anyio.to_thread.run_sync(_updated, _backup(ctx), fields)
                await anyio.to_thread.run_sync(write_atomically, target, new)
            except (OSError, ValueError) as exc:
                problem = f"cannot write {target}: {exc}"
            else:
                progress = msgspec.structs.replace(progress, stage="written")
                await ctx.store.set_fact(_fact(ctx), progress)
                problem = await _prove(ctx, cfg.kubelet)
            if problem:
                progress = await _restore(ctx, cfg.kubelet, msgspec.structs.replace(progress, failure=problem))
    if problem:
        if not progress.failure:
            await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, failure=problem))
        return Outcome(False, problem)
    await ctx.store.set_fact(_fact(ctx), msgspec.structs.replace(progress, stage="healthy"))
    return Outcome(True)


async def _restore(ctx: TaskContext, settings: KubeletConfig, progress: _Progress) -> _Progress:
    """The backup written back and the kubelet proven on it: ``rolled_back``, or as it was with both reasons."""
    target = Path(settings.config_file)
    try:
        saved = await anyio.to_thread.run_sync(_backup(ctx).read_bytes)
        await anyio.to_thread.run_sync(write_atomically, target, saved)
    except OSError as exc:
        problem = f"cannot restore {target}: {exc}"
    else:
        problem = await _prove(ctx, settings)
    if problem:
        failure = (
            f"the update failed ({progress.failure}) and the kubelet is not healthy on its restored file: {problem}"
        )
        restored = msgspec.structs.replace(progress, failure=failure)
    else:
        restored = msgspec.structs.replace(progress, stage="rolled_back")
    await ctx.store.set_fact(_fact(ctx), restored)
    return restored


async def roll_back(ctx: TaskContext) -> Outcome:
    progress = await ctx.store.get_fact(_fact(ctx), _Progress)
    if progress is None:
        return Outcome(True, "the kubelet's configuration was not changed (this task has no record of a backup)")
    why = progress.failure or "the kubelet was not healthy"
    if progress.stage in ("written", "healthy"):
        cfg, problem = await kubelet_settings(ctx, _refusal)
        if cfg is None:
            return Outcome(False, f"cannot restore the kubelet's configuration: {problem}")
        with anyio.CancelScope(shield=True):
            progress = await _restore(ctx, cfg.kubelet, progress)
        if progress.stage != "rolled_back":
            return Outcome(False, progress.failure)
    return Outcome(True, why)
