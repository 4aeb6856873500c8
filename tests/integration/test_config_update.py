"""ConfigUpdateJob end to end: real agent processes rewrite and restart onto their own configuration."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest
import yaml

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.kinds import CONFIG_UPDATE_JOB
from tests.integration.agents import agent_command, write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import running_controller, running_hub
from tests.integration.objects import create_job, job_when, settled, unique
from tools.processes import terminate

pytestmark = pytest.mark.integration
CONFIG_UPDATES = job_resource(CONFIG_UPDATE_JOB)


@asynccontextmanager
async def agent_process(node: str, token: str, url: str, home: Path) -> AsyncIterator[anyio.abc.Process]:
    """``nodetaskd --role=edge`` with a config file in ``home``; stopped with SIGTERM at the end."""
    config = write_agent_config(home, node=node, token=token, hub_urls=[url], configUpdateHealthDeadline=3)
    command = agent_command(config)
    process = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        await terminate(process, grace=10)


def _update(nodes: list[str], fields: dict[str, str]) -> dict[str, object]:
    return {"nodeNames": nodes, "updateFields": fields, "timeoutSeconds": 120, "concurrency": 3}


async def test_config_updates_apply_roll_back_or_are_refused_and_each_is_reported(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """A valid update is applied by the restarted agent; an unreachable hub rolls back; a bad key is refused."""
    ok, unhealthy, invalid = unique("cfg-ok"), unique("cfg-back"), unique("cfg-bad")
    tokens = await register_edges(crds, [ok, unhealthy, invalid])
    jobs = {node: unique("cfg") for node in (ok, unhealthy, invalid)}
    async with (
        running_controller(crds),
        running_hub(crds, "hub-config") as hub,
        agent_process(ok, tokens[ok], hub.url, tmp_path / ok) as first,
        agent_process(unhealthy, tokens[unhealthy], hub.url, tmp_path / unhealthy),
        agent_process(invalid, tokens[invalid], hub.url, tmp_path / invalid),
    ):
        await create_job(crds, "ConfigUpdateJob", jobs[ok], _update([ok], {"maxCpuUsage": "95", "logLevel": "debug"}))
        await create_job(
            crds, "ConfigUpdateJob", jobs[unhealthy], _update([unhealthy], {"hubUrls[0]": "ws://127.0.0.1:9"})
        )
        await create_job(crds, "ConfigUpdateJob", jobs[invalid], _update([invalid], {"maxCpuUsag": "95"}))
        done = {node: await job_when(cloud_kube, CONFIG_UPDATES, name, settled) for node, name in jobs.items()}
        assert first.returncode is None  # restarted in place: the same process, a new program image
    applied = done[ok].status.node_status[0]
    assert done[ok].status.phase is JobPhase.COMPLETED
    assert [(a.action, a.status) for a in applied.action_flow] == [
        ("Check", "True"),
        ("BackUp", "True"),
        ("Update", "True"),
    ]
    written = yaml.safe_load((tmp_path / ok / "edge.yaml").read_text())
    assert (written["maxCpuUsage"], written["logLevel"]) == (95, "debug")

    rolled = done[unhealthy].status.node_status[0]
    assert [(a.action, a.status) for a in rolled.action_flow] == [
        ("Check", "True"),
        ("BackUp", "True"),
        ("Update", "False"),
        ("RollBack", "True"),
    ]
    assert (rolled.phase, rolled.reason) == (
        NodeTaskPhase.FAILURE,
        "the config update failed and the previous config was restored",
    )
    assert "did not reach a hub within 3s" in rolled.action_flow[2].reason
    restored = yaml.safe_load((tmp_path / unhealthy / "edge.yaml").read_text())
    assert restored["hubUrls"] == [hub.url]

    refused = done[invalid].status.node_status[0]
    assert [(a.action, a.status) for a in refused.action_flow] == [("Check", "False")]
    assert "maxCpuUsag" in refused.reason
    assert yaml.safe_load((tmp_path / invalid / "edge.yaml").read_text()).get("maxCpuUsag") is None
