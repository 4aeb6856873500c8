"""ConfigUpdateJob end to end: real agent processes rewrite and restart onto their own configuration.

No admission webhook runs here, so these jobs reach the agents unchecked, as when the webhook is down.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from subprocess import DEVNULL
from typing import Any, Final

import anyio
import anyio.abc
import pytest
import yaml

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.edge.config_update import pending as config_pending
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.kinds import CONFIG_UPDATE_JOB
from tests.integration.agents import agent_command, write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import eventually, running_controller, running_hub
from tests.integration.objects import create_job, job_when, settled, unique
from tools.processes import terminate

pytestmark = pytest.mark.integration
CONFIG_UPDATES = job_resource(CONFIG_UPDATE_JOB)


@asynccontextmanager
async def agent_process(
    node: str, token: str, url: str, home: Path, *, command: list[str] | None = None
) -> AsyncIterator[anyio.abc.Process]:
    """``nodetaskd --role=edge`` with a config file in ``home``; stopped with SIGTERM at the end."""
    config = write_agent_config(home, node=node, token=token, hub_urls=[url], configUpdateHealthDeadline=3)
    process = await anyio.open_process(command or agent_command(config), stdout=DEVNULL, stderr=DEVNULL)
    try:
        yield process
    finally:
        await terminate(process, grace=10)


TOKEN_AS_STARTED: Final = """
import sys
from pathlib import Path

import msgspec

from roles.cli.main import main

config, token_file, token, under_update = sys.argv[1:]
updated = msgspec.yaml.decode(Path(config).read_bytes()).get("maxCpuUsage") == 95
Path(token_file).write_text(under_update if updated else token)
sys.exit(main(["--role=edge", f"--config={config}"]))
"""
"""Start the agent with ``token`` in its token file, or ``under_update`` while its configuration holds
the update (``maxCpuUsage: 95``). Run as ``python -c``, so that the agent's restarts run it again:
it stands in for a device on which the new configuration cannot start, which the update's Check,
running under the old configuration, cannot foresee."""


def _update(nodes: list[str], fields: dict[str, str]) -> dict[str, object]:
    return {"nodeNames": nodes, "updateFields": fields, "timeoutSeconds": 120, "concurrency": 3}


def _flow(job: Any) -> list[tuple[str, str]]:
    return [(a.action, a.status) for a in job.status.node_status[0].action_flow]


async def test_config_updates_apply_or_are_refused_and_each_is_reported(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """A valid update is applied by the restarted agent; a misspelt key is refused, naming it."""
    ok, invalid = unique("cfg-ok"), unique("cfg-bad")
    tokens = await register_edges(crds, [ok, invalid])
    jobs = {node: unique("cfg") for node in (ok, invalid)}
    async with (
        running_controller(crds),
        running_hub(crds, "hub-config") as hub,
        agent_process(ok, tokens[ok], hub.url, tmp_path / ok) as first,
        agent_process(invalid, tokens[invalid], hub.url, tmp_path / invalid),
    ):
        await create_job(crds, "ConfigUpdateJob", jobs[ok], _update([ok], {"maxCpuUsage": "95", "logLevel": "debug"}))
        await create_job(crds, "ConfigUpdateJob", jobs[invalid], _update([invalid], {"maxCpuUsag": "95"}))
        done = {node: await job_when(cloud_kube, CONFIG_UPDATES, name, settled) for node, name in jobs.items()}
        assert first.returncode is None  # restarted in place: the same process, a new program image
    assert done[ok].status.phase is JobPhase.COMPLETED
    assert _flow(done[ok]) == [("Check", "True"), ("BackUp", "True"), ("Update", "True")]
    written = yaml.safe_load((tmp_path / ok / "edge.yaml").read_text())
    assert (written["maxCpuUsage"], written["logLevel"]) == (95, "debug")
    assert not config_pending.pending_path(tmp_path / ok / "edge.yaml").exists()

    refused = done[invalid].status.node_status[0]
    assert _flow(done[invalid]) == [("Check", "False")]
    assert "maxCpuUsag is not a setting a ConfigUpdateJob may change" in refused.reason
    assert yaml.safe_load((tmp_path / invalid / "edge.yaml").read_text()).get("maxCpuUsag") is None


async def test_without_the_webhook_the_agent_refuses_to_change_its_hub_token_or_ca(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """Jobs stored with no webhook to refuse them fail their Check: the file is untouched, the agent stays."""
    node = unique("cfg-takeover")
    tokens = await register_edges(crds, [node])
    attempts = {
        "hubUrls[0]": {"hubUrls[0]": "ws://127.0.0.2:1", "hubUrls[1]": "ws://127.0.0.2:2"},
        "tokenFile": {"tokenFile": "/etc/hostname"},
        "caFile": {"caFile": "/nonexistent"},
    }
    jobs = {key: unique("cfg-takeover") for key in attempts}
    home = tmp_path / node
    async with (
        running_controller(crds),
        running_hub(crds, "hub-config-takeover") as hub,
        agent_process(node, tokens[node], hub.url, home) as agent,
    ):
        before = (home / "edge.yaml").read_bytes()
        for key, fields in attempts.items():
            await create_job(crds, "ConfigUpdateJob", jobs[key], _update([node], fields))
        done = {key: await job_when(cloud_kube, CONFIG_UPDATES, name, settled) for key, name in jobs.items()}
        assert agent.returncode is None
        assert node in hub.hub.sessions
    for key, job in done.items():
        assert _flow(job) == [("Check", "False")], key
        assert f"{key} is not a setting a ConfigUpdateJob may change" in job.status.node_status[0].reason
    assert (home / "edge.yaml").read_bytes() == before


async def test_an_update_the_agent_cannot_run_with_is_rolled_back_and_the_agent_stays_connected(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """A failed start and a missed hub each restore the previous file and report RollBack; no crash loop."""
    broken, unhealthy = unique("cfg-nostart"), unique("cfg-back")
    tokens = await register_edges(crds, [broken, unhealthy])
    jobs = {node: unique("cfg") for node in (broken, unhealthy)}
    under_update = {broken: "", unhealthy: "not-the-token"}  # empty: the agent refuses to start

    def command(node: str) -> list[str]:
        home = tmp_path / node
        token_args = [str(home / "token"), tokens[node], under_update[node]]
        return [sys.executable, "-c", TOKEN_AS_STARTED, str(home / "edge.yaml"), *token_args]

    async with (
        running_controller(crds),
        running_hub(crds, "hub-config-back") as hub,
        contextlib.AsyncExitStack() as stack,
    ):
        agents = {
            node: await stack.enter_async_context(
                agent_process(node, tokens[node], hub.url, tmp_path / node, command=command(node))
            )
            for node in jobs
        }
        before = {node: (tmp_path / node / "edge.yaml").read_bytes() for node in jobs}
        for node, name in jobs.items():
            await create_job(crds, "ConfigUpdateJob", name, _update([node], {"maxCpuUsage": "95"}))
        done = {node: await job_when(cloud_kube, CONFIG_UPDATES, name, settled) for node, name in jobs.items()}
        # Still the first process, back on its hub with the previous file: no exit, no loop.
        await eventually(lambda: all(node in hub.hub.sessions for node in jobs))
        assert [agent.returncode for agent in agents.values()] == [None, None]
    for node, job in done.items():
        assert _flow(job) == [("Check", "True"), ("BackUp", "True"), ("Update", "False"), ("RollBack", "True")]
        entry = job.status.node_status[0]
        assert (entry.phase, entry.reason) == (
            NodeTaskPhase.FAILURE,
            "the config update failed and the previous config was restored",
        )
        assert (tmp_path / node / "edge.yaml").read_bytes() == before[node]
        assert not config_pending.pending_path(tmp_path / node / "edge.yaml").exists()
    update_failed = done[broken].status.node_status[0].action_flow[2].reason
    assert update_failed.startswith("the agent could not start with the new configuration (tokenFile ")
    assert update_failed.endswith(" is empty); the previous configuration was restored")
    assert "did not reach a hub within 3s" in done[unhealthy].status.node_status[0].action_flow[2].reason
