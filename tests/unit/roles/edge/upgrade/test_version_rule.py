"""The upgrade version rule is one function: the webhook and the edge's Check agree on every version."""

from __future__ import annotations

import pytest

from flows.nodejobs import nodeupgradejob
from schemas.v1alpha2 import NodeUpgradeJobSpec
from schemas.validation import is_version, validate_create
from tests.unit.roles.edge.checks_run import run_check

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
    outcome = await run_check(nodeupgradejob.JOB_TYPE, NodeUpgradeJobSpec(version=version, node_names=("edge-1",)))
    assert is_version(version) is valid
    assert admitted is valid
    assert outcome.succ is valid, outcome.reason
