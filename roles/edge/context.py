"""What a device action is given and what it returns."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from roles.edge.checks.checks import Thresholds
from roles.edge.store.records import NodeTask
from roles.edge.store.store import EdgeStore

__all__ = ["Action", "Actions", "Outcome", "TaskContext", "take_exclusive"]


class Outcome(msgspec.Struct, frozen=True):
    """An action's result, as reported upstream."""

    succ: bool
    reason: str = ""
    extend: str = ""


class TaskContext(msgspec.Struct, frozen=True):
    """What an action may use."""

    task: NodeTask
    spec: Any
    """The decoded job spec (the job type's spec Struct)."""
    node: str
    version: str
    data_dir: Path
    thresholds: Thresholds
    store: EdgeStore
    config_file: Path | None = None
    health_deadline: float = 60.0
    wait_connected: Callable[[float], Awaitable[bool]] | None = None
    """Whether the agent reaches a hub within the given seconds: the health check after a restart."""
    read_node: Callable[[], Awaitable[Mapping[str, Any] | None]] | None = None
    """The device's own Node as its cache holds it: the health check after a kubelet restart."""


Action = Callable[[TaskContext], Awaitable[Outcome]]
Actions = Mapping[tuple[str, str], Action]
"""(resource type, action name) to the action."""


async def take_exclusive(ctx: TaskContext) -> Outcome | None:
    """Take the node's one upgrade/config-update slot; a failed Outcome if another task holds it."""
    holder = await ctx.store.try_begin_exclusive(ctx.task.job_uid, ctx.task.job_type)
    if holder is not None:
        return Outcome(False, f"the mutually exclusive task is being executed: {holder}")
    return None
