"""The agent's own ``/healthz`` and ``/metrics`` on loopback (``metrics.enabled``), scraped from a real agent process
while its hub goes away and comes back and while it runs a job."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from nodetask.phases import JobPhase
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.kinds import CONFIG_UPDATE_JOB
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import create_job, job_when, settled, unique
from tests.integration.processes import fleet
from tests.metric_samples import Samples, samples
from tools.ports import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.slow(60)]
LIMIT_S = 60.0


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.URLError as exc:
        return 0, str(exc)


def _scrape(port: int) -> Samples:
    status, text = _get(f"http://127.0.0.1:{port}/metrics")
    if status != 200:
        return {}
    return samples(text)


async def _until(port: int, what: str, holds: Callable[[Samples], bool]) -> Samples:
    """The first scrape for which ``holds``; fails naming ``what`` and the last scrape after :data:`LIMIT_S`."""
    seen: Samples = {}
    with anyio.move_on_after(LIMIT_S):
        # A scrape is all there is to wait on.
        while not holds(seen := await anyio.to_thread.run_sync(_scrape, port)):  # noqa: ASYNC110
            await anyio.sleep(0.2)
        return seen
    raise AssertionError(f"{what}: not within {LIMIT_S:g} s; last scrape: {seen}")


def _connected(samples: Samples) -> float:
    return samples.get(("nodetaskd_edge_hub_connected", ()), -1.0)


async def test_an_agents_metrics_follow_its_hub_session_and_its_tasks(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """Connected with one session; disconnected while its hub is stopped; a second session once it is back; a
    config update job then shows as a finished task with an empty outbox; healthz answers, process metrics
    are there."""
    (port,) = free_ports(1)
    options: dict[str, object] = {"metrics": {"enabled": True, "port": port}}
    async with fleet(crds, tmp_path, edges=1, hubs=1, edge_options=lambda _: options) as running:
        (node,) = running.edges
        first = await _until(port, "a hub session", lambda s: _connected(s) == 1)
        assert first[("nodetaskd_edge_hub_sessions_total", ())] == 1
        assert first[("nodetaskd_edge_store_ok", ())] == 1
        assert first[("nodetaskd_build_info", (("version", _version(first)),))] == 1
        assert first[("process_resident_memory_bytes", ())] > 1 << 20
        assert await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")

        (hub,) = running.hubs
        await hub.stop()
        await _until(port, "the session gone with its hub", lambda s: _connected(s) == 0)
        await hub.start()
        await hub.until_ready()
        again = await _until(port, "a second session", lambda s: _connected(s) == 1)
        assert again[("nodetaskd_edge_hub_sessions_total", ())] == 2

        job = unique("metrics")
        spec = {"nodeNames": [node], "updateFields": {"logLevel": "debug"}, "timeoutSeconds": 120}
        await create_job(crds, "ConfigUpdateJob", job, spec)
        done = await job_when(cloud_kube, job_resource(CONFIG_UPDATE_JOB), job, settled, limit_s=90)
        assert done.status.phase is JobPhase.COMPLETED, done.status
        after = await _until(port, "the finished task, its reports acknowledged", _finished_and_acknowledged)
        assert after[("nodetaskd_edge_tasks", (("state", "running"),))] == 0
        assert after[("nodetaskd_edge_store_bytes", ())] > 0


def _finished_and_acknowledged(samples: Samples) -> bool:
    finished = samples.get(("nodetaskd_edge_tasks", (("state", "finished"),)))
    return finished == 1 and samples.get(("nodetaskd_edge_outbox_depth", ())) == 0


def _version(samples: Samples) -> str:
    (version,) = [dict(labels)["version"] for name, labels in samples if name == "nodetaskd_build_info"]
    return version
