"""The upgrade version rule is one function: the webhook and the edge's Check agree on every version."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from flows.nodejobs import nodeupgradejob
from roles.edge.actions import build_actions
from roles.edge.checks.checks import Thresholds
from roles.edge.context import TaskContext
from roles.edge.store.records import NodeTask, TaskState
from roles.edge.store.store import EdgeStore
from schemas.v1alpha2 import NodeUpgradeJobSpec
from schemas.validation import is_version, validate_create

# KubeEdge's regex: ^v\d+\.\d+\.\d+(-[a-zA-Z0-9_.]+(?:-[a-zA-Z0-9_.]+)*)?$ (ASCII digits, true end).
VERSIONS = [
    ("v1.2.3", True),
    ("v1.2.3-rc_1", True),
    ("v1.2.3-rc.1-build.7", True),
    ("v1.2.3--x", False),
    ("v1.2.3-", False),
    ("v1.2.3-rc-", False),
    ("v1.2.3\n", False),
    ("v1.2.٣", False),
    ("1.2.3", False),
]


class _FreeSlot:
    """A store whose exclusive slot is always free (the only store call a passing Check makes)."""

    async def try_begin_exclusive(self, job_uid: str, kind: str) -> str | None:
        return None


def _context(version: str) -> TaskContext:
    task = NodeTask(
        job_uid="uid-1",
        route="operations.kubeedge.io/v1alpha2/nodeupgradejob/up/nodes/edge-1",
        job_type=nodeupgradejob.JOB_TYPE.resource_type,
        spec=b"{}",
        run_action_id="1",
        received_at=datetime.now(UTC),
        state=TaskState.RUNNING,
        current_action=nodeupgradejob.CHECK,
    )
    return TaskContext(
        task=task,
        spec=NodeUpgradeJobSpec(version=version, node_names=("edge-1",)),
        node="edge-1",
        version="v0.1.0",
        data_dir=Path("/nonexistent"),
        thresholds=Thresholds(),
        store=cast("EdgeStore", _FreeSlot()),
    )


@pytest.mark.parametrize(("version", "valid"), VERSIONS)
async def test_the_webhook_and_the_edge_check_agree_on_a_version(version: str, valid: bool) -> None:
    """A version the webhook admits passes the edge's Check, and one it refuses fails it with the same rule."""
    manifest = {
        "apiVersion": "operations.kubeedge.io/v1alpha2",
        "kind": "NodeUpgradeJob",
        "metadata": {"name": "up"},
        "spec": {"version": version, "image": "kubeedge/installation-package", "nodeNames": ["edge-1"]},
    }
    admitted = "spec.version" not in [e.path for e in validate_create(manifest)]
    check = build_actions(pull=None, credentials=lambda _: ({}, ""), self_upgrade=False)[
        (nodeupgradejob.JOB_TYPE.resource_type, nodeupgradejob.CHECK)
    ]
    outcome = await check(_context(version))
    assert is_version(version) is valid
    assert admitted is valid
    assert outcome.succ is valid, outcome.reason
