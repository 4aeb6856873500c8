"""Running one job type's Check as the agent would, outside an agent: its action from the agent's table, given a
task context whose store only ever has the node's exclusive slot free (the one store call a passing Check makes)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from flows.nodejobs.jobtype import JobType
from roles.edge.actions import build_actions
from roles.edge.checks.checks import Thresholds
from roles.edge.context import Outcome, TaskContext
from roles.edge.store.records import NodeTask, TaskState
from roles.edge.store.store import EdgeStore

NODE = "edge-1"


class _FreeSlot:
    async def try_begin_exclusive(self, job_uid: str, kind: str) -> str | None:
        return None


async def run_check(
    job_type: JobType, spec: object, *, config_file: Path | None = None, data_dir: Path | None = None
) -> Outcome:
    """``job_type``'s Check on ``spec``, by an agent that cannot upgrade itself, reading ``config_file``."""
    check_action = job_type.flow.first
    task = NodeTask(
        job_uid="uid-1",
        route=f"operations.kubeedge.io/v1alpha2/{job_type.resource_type}/j/nodes/{NODE}",
        job_type=job_type.resource_type,
        spec=b"{}",
        run_action_id="1",
        received_at=datetime.now(UTC),
        state=TaskState.RUNNING,
        current_action=check_action,
    )
    ctx = TaskContext(
        task=task,
        spec=spec,
        node=NODE,
        version="v0.1.0",
        data_dir=data_dir or Path("/nonexistent"),
        thresholds=Thresholds(),
        store=cast("EdgeStore", _FreeSlot()),
        config_file=config_file,
    )
    check = build_actions(pull=None, credentials=lambda _: ({}, ""), self_upgrade=False)[
        (job_type.resource_type, check_action)
    ]
    return await check(ctx)
