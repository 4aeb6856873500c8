"""NodeUpgradeJob end to end: agents under the launcher upgrade themselves from a real registry, or roll back."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import Kube
from roles.kube.resources import NODES, job_resource
from schemas.core import AGENT_VERSION_ANNOTATION
from schemas.kinds import NODE_UPGRADE_JOB
from tests.integration.agents import write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import running_controller, running_hub
from tests.integration.objects import create_job, job_when, settled, unique
from tools.processes import terminate
from tools.provision import upgrade_artifact
from tools.provision.containerd import Registry

pytestmark = [pytest.mark.integration, pytest.mark.slow(70)]
UPGRADES = job_resource(NODE_UPGRADE_JOB)
BASE_VERSION = "v0.1.0"


@asynccontextmanager
async def launched_agent(node: str, token: str, url: str, home: Path) -> AsyncIterator[anyio.abc.Process]:
    """``python -m roles.edge.launcher`` running the agent of ``node``; its output in ``home/launcher.log``."""
    config = write_agent_config(home, node=node, token=token, hub_urls=[url], upgradeHealthDeadline=10)
    command = [sys.executable, "-m", "roles.edge.launcher", f"--config={config}"]
    with (home / "launcher.log").open("wb") as log:
        # A group of its own, so a test can kill the launcher and every agent it ever started at once.
        process = await anyio.open_process(command, stdout=log, stderr=log, start_new_session=True)
        try:
            yield process
        finally:
            await terminate(process)


def _flow(job: Any) -> list[tuple[str, str]]:
    return [(a.action, a.status) for e in job.status.node_status[:1] for a in e.action_flow]


async def _annotated_version(kube: Kube, node: str, version: str) -> None:
    with anyio.fail_after(30):
        while True:
            if (await kube.get(NODES, node)).metadata.annotations.get(AGENT_VERSION_ANNOTATION) == version:
                return
            await anyio.sleep(0.2)


async def test_agents_upgrade_themselves_roll_back_a_broken_version_and_refuse_a_missing_one(
    crds: ControlPlane, cloud_kube: Kube, registry: Registry, tmp_path: Path
) -> None:
    """v0.2.0 is installed and kept; a version that crashes at start is rolled back; a missing image fails Check."""
    good, broken, missing = unique("upg-ok"), unique("upg-back"), unique("upg-miss")
    images = {
        good: f"{registry.host}/nodetaskd/agent",
        broken: f"{registry.host}/nodetaskd/broken",
        missing: f"{registry.host}/nodetaskd/missing",
    }
    versions = {good: "v0.2.0", broken: "v0.9.0", missing: "v0.2.0"}
    await anyio.to_thread.run_sync(lambda: upgrade_artifact.push(images[good], versions[good]))
    await anyio.to_thread.run_sync(lambda: upgrade_artifact.push(images[broken], versions[broken], broken=True))
    tokens = await register_edges(crds, list(images))
    jobs = {node: unique("upgrade") for node in images}
    async with (
        running_controller(crds),
        running_hub(crds, "hub-upgrade") as hub,
        launched_agent(good, tokens[good], hub.url, tmp_path / good) as launcher,
        launched_agent(broken, tokens[broken], hub.url, tmp_path / broken) as broken_launcher,
        launched_agent(missing, tokens[missing], hub.url, tmp_path / missing),
    ):
        for node in images:
            await _annotated_version(cloud_kube, node, BASE_VERSION)
        for node, name in jobs.items():
            spec = {"version": versions[node], "image": images[node], "nodeNames": [node], "timeoutSeconds": 120}
            await create_job(crds, "NodeUpgradeJob", name, spec)
        done = {node: await job_when(cloud_kube, UPGRADES, name, settled, limit_s=80) for node, name in jobs.items()}
        await _annotated_version(cloud_kube, good, "v0.2.0")
        await _annotated_version(cloud_kube, broken, BASE_VERSION)
        assert (launcher.returncode, broken_launcher.returncode) == (None, None)  # still supervising their agents

    upgraded = done[good].status.node_status[0]
    assert done[good].status.phase is JobPhase.COMPLETED
    assert _flow(done[good]) == [
        ("Check", "True"),
        ("WaitingConfirmation", "True"),
        ("BackUp", "True"),
        ("Upgrade", "True"),
    ]
    assert (upgraded.phase, upgraded.historic_version, upgraded.current_version) == (
        NodeTaskPhase.SUCCESSFUL,
        BASE_VERSION,
        "v0.2.0",
    )
    data = tmp_path / good / "data"
    assert (data / "current").resolve() == (data / "versions" / "v0.2.0").resolve()
    backup = data / "backup" / BASE_VERSION
    assert sorted(p.name for p in backup.iterdir()) == ["VERSION", "config.yaml", "current", "store.sqlite"]

    rolled = done[broken].status.node_status[0]
    assert _flow(done[broken]) == [
        ("Check", "True"),
        ("WaitingConfirmation", "True"),
        ("BackUp", "True"),
        ("Upgrade", "False"),
        ("RollBack", "True"),
    ]
    assert (rolled.phase, rolled.reason) == (NodeTaskPhase.FAILURE, "the upgrade failed and the node was rolled back")
    assert "v0.9.0 exited with status 1 3 times" in rolled.action_flow[3].reason
    assert (rolled.historic_version, rolled.current_version) == ("v0.9.0", BASE_VERSION)
    assert not (tmp_path / broken / "data" / "current").exists()  # back on the base installation

    refused = done[missing].status.node_status[0]
    assert _flow(done[missing]) == [("Check", "False")]
    assert f"{images[missing]}:v0.2.0" in refused.reason
    assert "not found" in refused.reason


async def test_an_agent_killed_during_its_upgrade_finishes_it_once_after_restart(
    crds: ControlPlane, cloud_kube: Kube, registry: Registry, tmp_path: Path
) -> None:
    """The launcher and its agent are SIGKILLed mid-upgrade (a power cut); started again, the node finishes once."""
    node = unique("upg-kill")
    image = f"{registry.host}/nodetaskd/killed"
    await anyio.to_thread.run_sync(lambda: upgrade_artifact.push(image, "v0.3.0"))
    tokens = await register_edges(crds, [node])
    name = unique("upgrade")
    async with running_controller(crds), running_hub(crds, "hub-upgrade-kill") as hub:
        async with launched_agent(node, tokens[node], hub.url, tmp_path) as first:
            await create_job(crds, "NodeUpgradeJob", name, {"version": "v0.3.0", "image": image, "nodeNames": [node]})
            await job_when(cloud_kube, UPGRADES, name, lambda j: ("BackUp", "True") in _flow(j), limit_s=60)
            os.killpg(first.pid, signal.SIGKILL)
            await first.wait()
        async with launched_agent(node, tokens[node], hub.url, tmp_path):
            job = await job_when(cloud_kube, UPGRADES, name, settled, limit_s=90)
            await _annotated_version(cloud_kube, node, "v0.3.0")
    entry = job.status.node_status[0]
    assert (entry.phase, entry.current_version) == (NodeTaskPhase.SUCCESSFUL, "v0.3.0")
    assert _flow(job) == [("Check", "True"), ("WaitingConfirmation", "True"), ("BackUp", "True"), ("Upgrade", "True")]
