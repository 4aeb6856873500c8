"""Issue 26's row: a NodeUpgradeJob with ``component: kubelet`` on one real node, how long it takes, and whether the
node's pod kept serving meanwhile.

Real processes on loopback, the kubelet tests' device (``tests/integration/kubelet_device.py``): a controller,
a hub relaying the device's API requests, the agent (``nodeApi`` and its ``kubelet`` block on), and the node: its
containerd and its kubelet under the device's supervisor (``tools/provision/supervise.py``), running one web pod.
A registry holds two kubelet artifacts, the base build (``v1.20.2``) and the next build of the same source
(``v1.20.3-nodetaskd.1``, :mod:`tools.provision.kubebuild`). Each run a job upgrades the node to the version it does
not run (``allowDowngrade``: the runs alternate) while a client asks the pod's web server for its page 10 times a
second, each time on a new connection with a 1 s deadline, from a second before the job until its end. Per run:

- created → dispatched → Ready: when the job was created, when its node first showed InProgress (the hub sent the
  task), when the Node first reported Ready with the new kubelet version, and when the job was Completed (the
  job and the Node polled as admin every 0.1 s);
- requests answered and failed, and the longest time between two answers (0.1 s when nothing was missed).
"""

from __future__ import annotations

import datetime
import functools
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from bench.cluster import admin
from bench.waits import Stalled, deadline
from nodetask.phases import JobPhase, NodeTaskPhase
from roles.kube import Kube, NotFound
from roles.kube.resources import NODES, job_resource
from schemas.kinds import NODE_UPGRADE_JOB
from tests.integration.device_nodes import eventually, web_container
from tests.integration.kubelet_device import kubelet_device
from tests.integration.objects import create_job, unique
from tools.provision import kubebuild, upgrade_artifact
from tools.provision.controlplane import ControlPlane
from tools.provision.node_images import WEB_PORT
from tools.provision.registry import start_registry
from tools.provision.runtime_processes import ensure_tools

UPGRADES = job_resource(NODE_UPGRADE_JOB)
BASE = f"v{kubebuild.KUBERNETES_VERSION}"
NEXT = f"v{kubebuild.NEXT_KUBELET_VERSION}"
RATE_PER_S = 10
REQUEST_LIMIT_S = 1.0
JOB_LIMIT_S = 240.0
Record = Callable[["UpgradeRun"], None]
Failed = Callable[[str, Exception], None]


@dataclass(frozen=True, slots=True)
class UpgradeRun:
    """One kubelet upgrade: seconds from the job's creation, and the pod's answers meanwhile."""

    target: str
    dispatched_s: float
    ready_s: float
    completed_s: float
    answered: int
    failed: int
    longest_gap_s: float
    flow: tuple[tuple[str, float], ...]
    """Each action of the node's flow and when it ended (its status stamp, whole seconds)."""


async def series(cp: ControlPlane, home: Path, *, runs: int, record: Record, fail: Failed) -> None:
    """``runs`` upgrades of one node's kubelet, alternating between the two builds: each run ``record``ed as it ends,
    a run that fails given to ``fail`` (what, why), and the next run goes on."""
    try:
        await _series(cp, home, runs=runs, record=record, fail=fail)
    except pytest.fail.Exception as exc:  # the harness's waits fail as a test would: a stall here
        raise Stalled(str(exc)) from None


async def _series(cp: ControlPlane, home: Path, *, runs: int, record: Record, fail: Failed) -> None:
    await anyio.Path(home).mkdir(parents=True, exist_ok=True)
    built = await anyio.to_thread.run_sync(kubebuild.ensure_built, ("kubelet", "kubelet-next"))
    tools = await anyio.to_thread.run_sync(ensure_tools)
    registry = await anyio.to_thread.run_sync(start_registry, home / "registry", tools)
    try:
        image = f"{registry.host}/nodetaskd/kubelet"
        for version, product in ((NEXT, "kubelet-next"), (BASE, "kubelet")):
            binary = await anyio.Path(built[product]).read_bytes()
            await anyio.to_thread.run_sync(functools.partial(upgrade_artifact.push, image, version, kubelet=binary))
        async with _kubelet_device(cp, home, image) as (name, pod_ip), admin(cp) as kube:
            for index in range(runs):
                target = BASE if await _version(kube, name) == NEXT else NEXT
                try:
                    record(await _upgrade(cp, kube, name, pod_ip, target))
                except Exception as exc:  # one failed run must not lose the others
                    fail(f"kubelet upgrade to {target}, run {index + 1}", exc)
    finally:
        await anyio.to_thread.run_sync(registry.stop)


async def _version(kube: Kube, node: str) -> str:
    info = (await kube.get(NODES, node)).status.node_info
    return info.kubelet_version if info is not None else ""


@asynccontextmanager
async def _kubelet_device(cp: ControlPlane, home: Path, image: str) -> AsyncIterator[tuple[str, str]]:
    """The device of ``test_kubelet_upgrade``, once its web pod runs: the node's name and the pod's IP."""
    async with kubelet_device(cp, home, image) as (name, node, namespace):
        found = await eventually("the web pod's container", lambda: web_container(cp, node, namespace, "web"))
        yield name, found[2]


async def _upgrade(cp: ControlPlane, kube: Kube, node: str, pod_ip: str, target: str) -> UpgradeRun:
    """One job to ``target``, with the pod asked for its page throughout."""
    answers: list[float] = []
    failures: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_ask, pod_ip, answers, failures)
        await anyio.sleep(1.0)
        job = unique("kubelet")
        spec = {
            "nodeNames": [node], "version": target, "component": "kubelet", "allowDowngrade": True,
            "timeoutSeconds": int(JOB_LIMIT_S),
        }  # fmt: skip
        created, wall = time.monotonic(), time.time()
        await create_job(cp, "NodeUpgradeJob", job, spec)
        with deadline(f"kubelet upgrade to {target}", JOB_LIMIT_S):
            seen = await _follow(kube, job, node, target, created)
        (entry,) = (await kube.get(UPGRADES, job)).status.node_status
        await anyio.sleep(1.0)
        tg.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(answers)]
    return UpgradeRun(
        target=target, dispatched_s=seen["dispatched"], ready_s=seen["ready"], completed_s=seen["completed"],
        answered=len(answers), failed=len(failures), longest_gap_s=max(gaps, default=float("inf")),
        flow=tuple((a.action, _stamp(a.time) - wall) for a in entry.action_flow),
    )  # fmt: skip


def _stamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def _follow(kube: Kube, job: str, node: str, target: str, created: float) -> dict[str, float]:
    """Seconds from ``created`` to each milestone of the job on ``node``; fails unless it Completed."""
    seen: dict[str, float] = {}
    while "completed" not in seen:
        await anyio.sleep(0.1)
        try:
            found = await kube.get(UPGRADES, job)
            current = await kube.get(NODES, node)
        except NotFound:
            continue
        now = time.monotonic() - created
        entries = found.status.node_status
        if entries and entries[0].phase is not NodeTaskPhase.PENDING:
            seen.setdefault("dispatched", now)
        info = current.status.node_info
        ready = any(c.type == "Ready" and c.status == "True" for c in current.status.conditions)
        if ready and info is not None and info.kubelet_version == target:
            seen.setdefault("ready", now)
        if found.status.phase is JobPhase.FAILURE:
            raise RuntimeError(f"the kubelet upgrade to {target} failed: {entries[0].reason if entries else ''}")
        if found.status.phase is JobPhase.COMPLETED:
            seen["completed"] = now
            seen.setdefault("dispatched", now)
            seen.setdefault("ready", now)
    return seen


async def _ask(ip: str, answers: list[float], failures: list[float]) -> None:
    """Ask the pod for its page ``RATE_PER_S`` times a second, each request on its own connection."""
    async with anyio.create_task_group() as tg:
        while True:
            tg.start_soon(_one_request, ip, answers, failures)
            await anyio.sleep(1 / RATE_PER_S)


async def _one_request(ip: str, answers: list[float], failures: list[float]) -> None:
    head = b""
    with anyio.move_on_after(REQUEST_LIMIT_S) as scope:
        try:
            async with await anyio.connect_tcp(ip, WEB_PORT) as stream:
                await stream.send(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n")
                head = await stream.receive()
                while True:  # to the end of the answer: a server that dies mid-answer fails the request
                    try:
                        await stream.receive()
                    except anyio.EndOfStream:
                        break
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError):
            failures.append(time.monotonic())
            return
    if scope.cancelled_caught or not head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
        failures.append(time.monotonic())
    else:
        answers.append(time.monotonic())
