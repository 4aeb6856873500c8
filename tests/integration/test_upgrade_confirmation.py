"""NodeUpgradeJob with requireConfirmation: the flow pauses, and is released from the cloud or the device."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.core import CONFIRM_ANNOTATION
from schemas.kinds import NODE_UPGRADE_JOB
from tests.integration.agents import FakeRuntime, running_agent
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import running_controller, running_hub
from tests.integration.objects import create_job, job_when, kubectl, unique

pytestmark = pytest.mark.integration
UPGRADES = job_resource(NODE_UPGRADE_JOB)


def _actions(job: Any, node: str) -> list[tuple[str, str]]:
    entries = [e for e in job.status.node_status if e.node_name == node]
    return [(a.action, a.status) for e in entries for a in e.action_flow]


async def test_confirmation_gate_is_released_from_the_cloud_and_from_the_device(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """Both nodes pause after WaitingConfirmation; a job annotation releases one, `--confirm` the other."""
    by_cloud, by_device = unique("confirm-cloud"), unique("confirm-dev")
    tokens = await register_edges(crds, [by_cloud, by_device])
    name = unique("gated")
    spec = {"version": "v1.2.3", "nodeNames": [by_cloud, by_device], "requireConfirmation": True, "concurrency": 2}
    paused = [("Check", "True"), ("WaitingConfirmation", "True")]
    async with (
        running_controller(crds),
        running_hub(crds, "hub-confirm") as hub,
        running_agent(by_cloud, tokens[by_cloud], hub.url, tmp_path / "c", FakeRuntime()),
        running_agent(by_device, tokens[by_device], hub.url, tmp_path / "d", FakeRuntime()),
    ):
        await create_job(crds, "NodeUpgradeJob", name, spec)
        waiting = await job_when(
            cloud_kube, UPGRADES, name, lambda j: all(_actions(j, n) == paused for n in (by_cloud, by_device))
        )
        await anyio.sleep(1.0)  # nothing moves on its own while waiting
        assert _actions(await cloud_kube.get(UPGRADES, name), by_cloud) == paused

        await kubectl(crds, "annotate", "nodeupgradejob", name, f"{CONFIRM_ANNOTATION}={by_cloud}")
        released = await job_when(cloud_kube, UPGRADES, name, lambda j: len(_actions(j, by_cloud)) > 2)
        assert _actions(released, by_device) == paused

        command = [
            sys.executable,
            "-m",
            "roles.cli",
            "--role=edge",
            f"--node-name={by_device}",
            "--hub-url=ws://127.0.0.1:1",
            f"--data-dir={tmp_path / 'd'}",
            f"--confirm={name}",
        ]
        confirmed = await anyio.run_process(command, check=False)
        again = await anyio.run_process(command, check=False)
        done = await job_when(cloud_kube, UPGRADES, name, lambda j: j.status.phase is JobPhase.FAILURE)
    assert waiting.status.phase is JobPhase.IN_PROGRESS
    assert (confirmed.returncode, confirmed.stdout.decode().strip()) == (0, f"ok: {name} resumes at BackUp")
    assert again.returncode == 1
    assert b"no task of job" in again.stdout
    for node in (by_cloud, by_device):
        assert _actions(done, node) == [*paused, ("BackUp", "False")]
        entry = next(e for e in done.status.node_status if e.node_name == node)
        assert entry.phase is NodeTaskPhase.FAILURE
        # In-process agents have no launcher to restart them onto another version: BackUp says so.
        assert entry.reason == (
            "agent self-upgrade is not available in nodetaskd v0.1.0 on this node:"
            " the agent does not run under roles.edge.launcher"
        )
