"""The device actions of each job type, looked up by (job type, action name).

An action is an async function of a :class:`TaskContext` returning an :class:`Outcome`; it never
raises for a device failure (that is a failed outcome with a reason). Which actions exist is
decided by :func:`build_actions` when the agent starts, from what the device offers (a container
runtime or not), so nothing is registered at import time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Literal

from flows.diagnosis import job as diagnosis_job
from flows.diagnosis.job import TaskRun
from flows.nodejobs import configupdatejob, imageprepulljob, nodeupgradejob
from flows.nodejobs.jobtype import ExtendError
from nodetask.phases import ConditionStatus
from nodetask.registry_credentials import RegistryAuth
from roles.edge import processors
from roles.edge.checks.checks import run_checks
from roles.edge.config_update import config_update
from roles.edge.context import Action, Actions, Outcome, TaskContext, take_exclusive
from roles.edge.processors import ProcessorEnv, ProcessorOutcome
from roles.edge.upgrade import upgrade
from schemas.processors import Processor
from schemas.v1alpha2 import ImageStatus, NodeComponent
from schemas.version_rule import is_version

__all__ = ["PullImages", "RunProcessor", "build_actions", "diagnosis_run"]

AuthFor = Callable[[str], RegistryAuth | None]
PullImages = Callable[[tuple[str, ...], int, AuthFor], Awaitable[tuple[ImageStatus, ...]]]
"""Pull ``images`` with ``retryTimes``, each with its registry's credentials: per-image statuses."""
Credentials = Callable[[str], tuple[Mapping[str, RegistryAuth], str]]
"""A job's credentials by image as the hub sent them, and the hub's reason when it had none to send."""
RunProcessor = Callable[[Processor, Mapping[str, str], ProcessorEnv], Awaitable[ProcessorOutcome]]
"""Runs a diagnosis processor on request data (:func:`roles.edge.processors.run`)."""


async def _checks(ctx: TaskContext, items: tuple[str, ...]) -> Outcome:
    result = await run_checks(items, data_dir=ctx.data_dir, thresholds=ctx.thresholds)
    return Outcome(result.ok, result.reason)


def _unavailable(what: str, why: str = "") -> Action:
    async def action(ctx: TaskContext) -> Outcome:
        because = f": {why}" if why else ""
        return Outcome(False, f"{what} is not available in nodetaskd {ctx.version} on this node{because}")

    return action


# -------------------------------------------------------------------------------- ImagePrePullJob


async def _prepull_check(ctx: TaskContext) -> Outcome:
    return await _checks(ctx, ctx.spec.image_pre_pull_template.check_items)


def _prepull_pull(pull: PullImages, credentials: Credentials) -> Action:
    async def action(ctx: TaskContext) -> Outcome:
        template = ctx.spec.image_pre_pull_template
        creds, problem = credentials(ctx.task.job_uid)
        if problem:
            statuses = tuple(
                ImageStatus(image=i, status=ConditionStatus.FALSE, reason=problem) for i in template.images
            )
            return Outcome(False, problem, imageprepulljob.encode_extend(statuses))
        statuses = await pull(template.images, template.retry_times, creds.get)
        failed = [s for s in statuses if s.status is not ConditionStatus.TRUE]
        reason = "; ".join(f"{s.image}: {s.reason}" for s in failed)
        return Outcome(not failed, reason, imageprepulljob.encode_extend(statuses))

    return action


# --------------------------------------------------------------------------------- NodeUpgradeJob


def _upgrade_check(*, find_artifact: Callable[[TaskContext], Awaitable[Outcome | None]] | None) -> Action:
    async def action(ctx: TaskContext) -> Outcome:
        if not is_version(ctx.spec.version):
            return Outcome(False, f"version {ctx.spec.version!r} is not of the form vX.Y.Z")
        checked = await _checks(ctx, ctx.spec.check_items)
        if not checked.succ:
            return checked
        find = find_artifact
        if ctx.spec.component is NodeComponent.KUBELET:
            from roles.edge.kubelet import upgrade as kubelet_upgrade  # noqa: PLC0415 (see _kubelet)

            find = kubelet_upgrade.check
        if find is not None and (refused := await find(ctx)) is not None:
            return refused
        # Last, so that a failed check never holds the node's slot.
        return await take_exclusive(ctx) or Outcome(True)

    return action


def _kubelet(job: Literal["upgrade", "config"], step: str) -> Action:
    """Step ``step`` of the kubelet's upgrade or configuration, loaded with the first kubelet job: most devices
    never get one, and an idle agent carries none of it."""

    async def action(ctx: TaskContext) -> Outcome:
        # Deferred on purpose (see above).
        from roles.edge.kubelet import config as kubelet_config  # noqa: PLC0415
        from roles.edge.kubelet import upgrade as kubelet_upgrade  # noqa: PLC0415

        run: Action = getattr(kubelet_upgrade if job == "upgrade" else kubelet_config, step)
        return await run(ctx)

    return action


def _by_component(agent: Action, kubelet: Action) -> Action:
    """A NodeUpgradeJob or ConfigUpdateJob step: the agent's own, or the kubelet's for ``component: kubelet``."""

    async def action(ctx: TaskContext) -> Outcome:
        return await (kubelet if ctx.spec.component is NodeComponent.KUBELET else agent)(ctx)

    return action


async def _waiting_confirmation(ctx: TaskContext) -> Outcome:
    # Always a success: with requireConfirmation the runner pauses after reporting it (KubeEdge).
    return Outcome(True)


# ------------------------------------------------------------------------------- diagnosis Task


def diagnosis_run(env: ProcessorEnv, run: RunProcessor = processors.run) -> Action:
    """A Task's one action: its Operation's processor on its request data; the results go in ``extend``.

    Not exclusive: a diagnosis only looks at the device, so it runs beside an upgrade or config update.
    """

    async def action(ctx: TaskContext) -> Outcome:
        spec: TaskRun = ctx.spec
        request = {**spec.request}
        request.setdefault("task.uid", ctx.task.job_uid)
        log = env.logger.bind(task=f"{spec.namespace}/{spec.name}", uid=ctx.task.job_uid, operation=spec.operation)
        outcome = await run(spec.processor, request, dataclasses.replace(env, log=log))
        if not outcome.succeeded:
            return Outcome(False, outcome.reason or f"the processor of Operation {spec.operation} failed")
        try:
            return Outcome(True, "", diagnosis_job.encode_results(outcome.results))
        except ExtendError as exc:
            return Outcome(False, f"Operation {spec.operation}: {exc}")

    return action


def build_actions(
    *,
    pull: PullImages | None,
    credentials: Credentials,
    self_upgrade: bool | None = None,
    diagnosis: ProcessorEnv | None = None,
) -> Actions:
    """The actions this agent can run; ``pull`` is None where no container runtime is reachable.

    ``self_upgrade`` says whether the agent can restart onto another installed version, which
    only its launcher can do (None: whether the launcher started this process). Without it the
    NodeUpgradeJob still runs Check and WaitingConfirmation, and then fails with that reason. A
    NodeUpgradeJob with ``component: kubelet`` needs no launcher (:mod:`roles.edge.kubelet.upgrade`).
    ``diagnosis`` is what diagnosis processors may use; without it, Tasks fail saying so.
    """
    if self_upgrade is None:
        self_upgrade = upgrade.supervised()
    no_upgrade = _unavailable("agent self-upgrade", "the agent does not run under roles.edge.launcher")
    prepull = imageprepulljob.JOB_TYPE.resource_type
    node_upgrade = nodeupgradejob.JOB_TYPE.resource_type
    config = configupdatejob.JOB_TYPE.resource_type
    table: dict[tuple[str, str], Action] = {
        (prepull, imageprepulljob.CHECK): _prepull_check,
        (prepull, imageprepulljob.PULL): (
            _prepull_pull(pull, credentials) if pull is not None else _unavailable("a container runtime")
        ),
        (node_upgrade, nodeupgradejob.CHECK): _upgrade_check(
            find_artifact=upgrade.find_artifact if self_upgrade else None
        ),
        (node_upgrade, nodeupgradejob.WAITING_CONFIRMATION): _waiting_confirmation,
        (node_upgrade, nodeupgradejob.BACK_UP): _by_component(
            upgrade.back_up if self_upgrade else no_upgrade, _kubelet("upgrade", "back_up")
        ),
        (node_upgrade, nodeupgradejob.UPGRADE): _by_component(
            upgrade.upgrade if self_upgrade else no_upgrade, _kubelet("upgrade", "upgrade")
        ),
        (node_upgrade, nodeupgradejob.ROLL_BACK): _by_component(
            upgrade.roll_back if self_upgrade else no_upgrade, _kubelet("upgrade", "roll_back")
        ),
        (config, configupdatejob.CHECK): _by_component(config_update.check, _kubelet("config", "check")),
        (config, configupdatejob.BACK_UP): _by_component(config_update.back_up, _kubelet("config", "back_up")),
        (config, configupdatejob.UPDATE): _by_component(config_update.update, _kubelet("config", "update")),
        (config, configupdatejob.ROLL_BACK): _by_component(config_update.roll_back, _kubelet("config", "roll_back")),
        (diagnosis_job.RESOURCE_TYPE, diagnosis_job.RUN): (
            diagnosis_run(diagnosis) if diagnosis is not None else _unavailable("diagnosis", "no processor settings")
        ),
    }
    return MappingProxyType(table)
