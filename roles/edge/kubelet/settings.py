"""The agent's ``kubelet`` settings as a kubelet job reads them: when its action runs, so that a changed file
applies to the next job, and refused (naming the setting) while they do not allow the job."""

from __future__ import annotations

from collections.abc import Callable

import anyio.to_thread

from roles.common.config import ConfigError, EdgeConfig, load_config
from roles.common.edge_config import KubeletConfig
from roles.edge.context import TaskContext

__all__ = ["UPGRADES_OFF", "kubelet_settings"]

UPGRADES_OFF = "kubelet upgrades are off on this node: kubelet.binary is not set in its configuration"


def _load(ctx: TaskContext) -> tuple[EdgeConfig | None, str]:
    if ctx.config_file is None:
        return EdgeConfig(), ""
    try:
        cfg = load_config("edge", ctx.config_file, {})
    except ConfigError as exc:
        return None, f"cannot read the agent's configuration: {exc}"
    assert isinstance(cfg, EdgeConfig)
    return cfg, ""


async def kubelet_settings(
    ctx: TaskContext, refusal: Callable[[KubeletConfig], str] = lambda k: "" if k.enabled else UPGRADES_OFF
) -> tuple[EdgeConfig | None, str]:
    """The agent's configuration, or (None, why not): unreadable, or ``refusal`` of its ``kubelet`` block says why."""
    cfg, problem = await anyio.to_thread.run_sync(_load, ctx)
    if cfg is not None and (problem := refusal(cfg.kubelet)):
        return None, problem
    return cfg, problem
