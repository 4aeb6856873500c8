"""The controller as a real process under its Deployment's memory limit, against what anyone can send it.

Whoever may create objects (even as a dry run) chooses what the webhooks review, and whoever reaches
the pod network reaches the webhook and metrics ports. Each test sends what once cost the controller
hundreds of MiB, its event loop for seconds and its leader Lease, then checks what matters in a
cluster: the process lives, answers and still leads, its answers and log lines stay short, and its
peak resident memory stayed under ``containers/deploy/controller.yaml``'s limit.

The memory limit: a container's limit (512Mi) counts resident memory, which no rlimit does.
``RLIMIT_AS`` counts address space, of which a resting controller has far more than it has resident
(thread stacks and malloc arenas are reserved, not touched). So the controller starts unlimited; once
it leads and its webhook has answered (its worker thread exists), it is given an address-space limit
of what it has reserved then plus what the container would still let it touch (512 MiB less its
resident memory then), and at the end its peak resident memory (VmHWM) must be under 512 MiB. The
first keeps a runaway from taking the shared machine's memory; the second is the container's rule.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import resource
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest
import trio

from flows.diagnosis.tasks import DIAGNOSIS_UID_LABEL
from schemas.core import EDGE_ROLE_LABEL
from tests.integration.controlplane import ControlPlane
from tests.integration.objects import unique
from tools.ports import free_port
from tools.processes import http_get, role_command, terminate

pytestmark = [pytest.mark.integration, pytest.mark.slow(170)]

MEMORY_LIMIT = 512 << 20
"""``resources.limits.memory`` of the controller in containers/deploy/controller.yaml."""
ANSWER_BYTES = 16 << 10
"""An answer longer than this lists more than a person reads (20 errors of at most 512 characters each)."""
LOG_LINE_BYTES = 16 << 10
DIAG = "diagnosis.kubediag.org/v1"
JOBS = "operations.kubeedge.io/v1alpha2"
DENIED = 'admission webhook "validate.nodetask.kubeedge.io" denied the request'
WEBHOOK_PER_PEER, WEBHOOK_TOTAL, METRICS_PER_PEER = 64, 256, 16
"""The defaults of webhookMaxConnectionsPerPeer, webhookMaxConnections and metricsMaxConnectionsPerPeer."""
SLACK_FILES = 16
"""Descriptors the controller may open meanwhile for itself (API connections, a worker thread's)."""


def _status(pid: int) -> dict[str, int]:
    """The kB figures of /proc/<pid>/status (VmRSS, VmHWM, VmSize...), in bytes."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith(" kB"):
            values[key] = int(value.split()[0]) << 10
    return values


def _post(port: int, body: bytes) -> tuple[int, bytes]:
    """POST ``body`` to the validating webhook over TLS, as a client that checks nothing."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
    try:
        connection.request("POST", "/validate", body, {"content-type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def _review(kind: dict[str, str], obj: dict[str, Any]) -> bytes:
    request = {"uid": "u-1", "kind": kind, "operation": "CREATE", "name": "huge", "object": obj, "dryRun": True}
    return msgspec.json.encode({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})


def _diagnosis(names: int) -> dict[str, Any]:
    targets = {"targetNodeNames": [""] * names}
    metadata = {"name": unique("huge"), "namespace": "default"}
    return {
        "apiVersion": DIAG,
        "kind": "Diagnosis",
        "metadata": metadata,
        "spec": {"operationSet": "g", "targetSelector": targets},
    }


def _upgrade(names: int) -> dict[str, Any]:
    spec = {"version": "v1.21.0", "nodeNames": [""] * names}
    return {"apiVersion": JOBS, "kind": "NodeUpgradeJob", "metadata": {"name": unique("huge")}, "spec": spec}


async def _until(check: Callable[[], Awaitable[bool]], wanted: bool) -> None:
    """Poll ``check`` until it says ``wanted``; a minute at most."""
    with anyio.fail_after(60):
        while True:
            if await check() == wanted:
                return
            await anyio.sleep(0.2)


@dataclass
class Controller:
    cp: ControlPlane
    process: anyio.abc.Process
    log: Path
    webhook_port: int
    metrics_port: int

    def _get(self, path: str) -> tuple[int, str]:
        # Five seconds: a controller near its memory limit may be slow to answer.
        return http_get(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5)

    async def metrics(self) -> str:
        return (await anyio.to_thread.run_sync(self._get, "/metrics"))[1]

    async def healthy(self) -> bool:
        status, _ = await anyio.to_thread.run_sync(self._get, "/healthz")
        return status == 200

    async def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return await anyio.to_thread.run_sync(functools.partial(self.cp.kubectl, *args, input=input, check=False))

    async def webhook_refuses(self) -> bool:
        """Whether a dry-run create of an invalid job is refused by the validating webhook now."""
        probe = _upgrade(0) | {"spec": {"version": "latest", "nodeNames": ["a"]}}
        result = await self.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe))
        return DENIED in result.stderr

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    async def check_unharmed(self) -> None:
        """Alive, answering, still leading, never lost its Lease, short log lines, peak memory under the limit."""
        assert self.process.returncode is None, self.log.read_text()[-4000:]
        peak = _status(self.process.pid)["VmHWM"]
        assert peak < MEMORY_LIMIT, f"peak resident memory {peak >> 20} MiB"
        assert await self.healthy()
        assert "nodetaskd_controller_leader 1.0" in await self.metrics()
        await _until(self.webhook_refuses, True)
        lines = self.log.read_bytes().splitlines()
        assert max(map(len, lines)) < LOG_LINE_BYTES
        events = [json.loads(line).get("event") for line in lines if line.startswith(b"{")]
        assert "leadership_lost" not in events


@pytest.fixture
async def controller(crds: ControlPlane, tmp_path: Path) -> AsyncIterator[Controller]:
    """A controller process that leads, serves and registers its webhooks, with the memory limit described above."""
    webhook_port, metrics_port = free_port(), free_port()
    config = {
        "kubeconfig": str(crds.kubeconfig("controller")),
        "identity": "limits-test",
        "leaseName": unique("limits-lease"),
        "leaseDuration": 6,
        "listenHost": "127.0.0.1",
        "webhookPort": webhook_port,
        "webhookUrl": f"https://127.0.0.1:{webhook_port}",
        "certDir": str(tmp_path / "tls"),
        "metricsPort": metrics_port,
        "logFormat": "json",
    }
    (tmp_path / "controller.yaml").write_bytes(msgspec.yaml.encode(config))
    command = role_command("controller", tmp_path / "controller.yaml")
    log = tmp_path / "controller.log"
    env = {k: v for k, v in os.environ.items() if k != "POD_IP"}  # the webhook listens on listenHost
    with log.open("wb") as out:
        process = await anyio.open_process(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    running = Controller(crds, process, log, webhook_port, metrics_port)
    try:
        with anyio.fail_after(60):
            while "nodetaskd_controller_leader 1.0" not in await running.metrics():
                assert process.returncode is None, log.read_text()
                await anyio.sleep(0.2)
        # The API server enforces webhooks once its own watch has seen them.
        await _until(running.webhook_refuses, True)
        rest = _status(process.pid)
        address_space = rest["VmSize"] + MEMORY_LIMIT - rest["VmRSS"]
        resource.prlimit(process.pid, resource.RLIMIT_AS, (address_space, address_space))
        yield running
    finally:
        with anyio.CancelScope(shield=True):
            await terminate(process)
            # Their policy is Fail and their server is gone: remove them, and wait until the API server has.
            await running.kubectl(
                "delete",
                "validatingwebhookconfiguration,mutatingwebhookconfiguration",
                "nodetaskd",
                "--ignore-not-found",
            )
            await _until(running.webhook_refuses, False)


async def test_a_dry_run_of_a_million_empty_target_names_is_refused_in_a_few_lines(controller: Controller) -> None:
    """A 3 MB Diagnosis sent as a dry run is refused naming its first errors and saying there are more, briefly."""
    doc = json.dumps(_diagnosis(1_000_000), separators=(",", ":"))
    assert len(doc) > 3_000_000
    result = await controller.kubectl("create", "--dry-run=server", "--validate=false", "-f", "-", input=doc)
    assert result.returncode != 0
    assert DENIED in result.stderr
    assert "spec.targetSelector.targetNodeNames[0]: must be a non-empty node name" in result.stderr
    assert "and more: checking stops after the first 20 errors" in result.stderr
    assert len(result.stderr) < ANSWER_BYTES
    await controller.check_unharmed()


async def test_huge_reviews_sent_straight_to_the_webhook_port_get_short_answers(controller: Controller) -> None:
    """Three 3 MB reviews at once and a job of 100,000 empty node names, straight to the port: each answer is short."""
    diagnosis = _review(
        {"group": "diagnosis.kubediag.org", "version": "v1", "kind": "Diagnosis"}, _diagnosis(1_000_000)
    )
    upgrade = _review(
        {"group": "operations.kubeedge.io", "version": "v1alpha2", "kind": "NodeUpgradeJob"}, _upgrade(100_000)
    )
    answers: list[tuple[int, bytes]] = []

    async def send(body: bytes) -> None:
        answers.append(await anyio.to_thread.run_sync(_post, controller.webhook_port, body))

    async with anyio.create_task_group() as tg:
        for body in (diagnosis, diagnosis, diagnosis, upgrade):
            tg.start_soon(send, body)
    assert len(answers) == 4
    for status, body in answers:
        assert status == 200, body[:200]
        assert len(body) < ANSWER_BYTES
        response = json.loads(body)["response"]
        assert response["allowed"] is False
        assert response["status"]["message"].endswith("and more: checking stops after the first 20 errors")
    await controller.check_unharmed()


async def _idle(port: int, peer: str, count: int) -> list[trio.SocketStream]:
    """``count`` connections from address ``peer`` that never send a byte."""
    return [await trio.open_tcp_stream("127.0.0.1", port, local_address=peer) for _ in range(count)]


async def test_idle_connections_past_the_caps_are_closed_at_once_and_the_controller_still_answers(
    controller: Controller,
) -> None:
    """One address flooding both ports holds only its share while the API server still reaches the webhook; ten
    thousand connections from many addresses hold only the webhook's total; nothing else is kept, nothing breaks."""
    before = controller.open_files()
    flood = await _idle(controller.webhook_port, "127.0.0.2", 1000)
    flood += await _idle(controller.metrics_port, "127.0.0.2", 200)
    try:
        # The API server (127.0.0.1) gets its review answered, and health is answered, past the flood's queue.
        assert await controller.webhook_refuses()
        assert await controller.healthy()
        assert controller.open_files() - before <= WEBHOOK_PER_PEER + METRICS_PER_PEER + SLACK_FILES
        for i in range(12):
            flood += await _idle(controller.webhook_port, f"127.0.1.{i + 1}", 800)
        assert await controller.healthy()
        assert controller.open_files() - before <= WEBHOOK_TOTAL + METRICS_PER_PEER + SLACK_FILES
        assert _status(controller.process.pid)["VmHWM"] < MEMORY_LIMIT
    finally:
        for stream in flood:
            stream.socket.close()
    await controller.check_unharmed()


async def test_a_diagnosis_naming_hundreds_of_made_up_nodes_costs_a_task_only_per_edge_node(
    controller: Controller,
) -> None:
    """Someone who may only create Diagnoses in one namespace: 60 KiB of parameters (under the webhook's 64 KiB)
    and 300 made-up node names beside two edge Nodes. Two Tasks, each small, where each name cost a Task carrying
    the parameters (150 such names with 600 KiB took etcd from 3 to 223 MB, about 1,400 filled its quota, and
    the controller and every hub kept them all); 600 KiB of parameters are refused outright (as a dry run). The
    controller stays under its 512Mi and keeps its Lease; the Diagnosis names the first made-up names."""
    prefix = unique("fanout")
    edges = [f"{prefix}-edge-{i}" for i in range(2)]
    made_up = [f"{prefix}-made-up-{i:03d}" for i in range(300)]
    operation, operation_set, name = f"{prefix}-probe", f"{prefix}-set", f"{prefix}-diag"
    processor = {"builtin": {"name": "node.resources"}, "timeoutSeconds": 30}
    documents: list[dict[str, Any]] = [
        *(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {EDGE_ROLE_LABEL: ""}}}
            for n in edges
        ),
        {"apiVersion": DIAG, "kind": "Operation", "metadata": {"name": operation}, "spec": {"processor": processor}},
        {
            "apiVersion": DIAG,
            "kind": "OperationSet",
            "metadata": {"name": operation_set},
            "spec": {"adjacencyList": [{"to": [1]}, {"operation": operation}]},
        },
    ]

    def diagnosis(diagnosis_name: str, parameter_bytes: int) -> str:
        spec = {
            "operationSet": operation_set,
            "parameters": {"blob": "b" * parameter_bytes},
            "targetSelector": {"nodeNames": [*edges, *made_up]},
        }
        metadata = {"name": diagnosis_name, "namespace": "default"}
        return json.dumps({"apiVersion": DIAG, "kind": "Diagnosis", "metadata": metadata, "spec": spec})

    async def stored() -> dict[str, Any]:
        found = await controller.kubectl("get", "diagnosis", "-n", "default", name, "-o", "json")
        assert found.returncode == 0, found.stderr
        obj: dict[str, Any] = json.loads(found.stdout)
        return obj

    try:
        made = await controller.kubectl(
            "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
        )
        assert made.returncode == 0, made.stderr
        huge = diagnosis(f"{prefix}-huge", 600 << 10)
        refused = await controller.kubectl("create", "--dry-run=server", "-f", "-", input=huge)
        assert DENIED in refused.stderr
        size = (600 << 10) + len('{"blob":""}')
        assert f"spec.parameters: take {size} bytes as JSON; a Diagnosis's may take at most 65536" in refused.stderr
        created = await controller.kubectl("create", "-f", "-", input=diagnosis(name, 60 << 10))
        assert created.returncode == 0, created.stderr
        with anyio.fail_after(60):
            while True:
                obj = await stored()
                if obj.get("status", {}).get("nodeNames"):
                    break
                await anyio.sleep(0.2)
        assert obj["status"]["nodeNames"] == edges
        [accepted] = [c for c in obj["status"]["conditions"] if c["type"] == "Accepted"]
        assert accepted["message"].startswith(f"2 target nodes; left out: node {made_up[0]} does not exist;")
        assert accepted["message"].endswith("; and 290 more")
        selector = f"{DIAGNOSIS_UID_LABEL}={obj['metadata']['uid']}"
        with anyio.fail_after(60):
            while True:
                tasks = await _listed(controller, "tasks", "-n", "default", "-l", selector)
                if len(tasks) >= len(edges):
                    break
                await anyio.sleep(0.2)
        assert sorted(t["spec"]["nodeName"] for t in tasks) == edges
        assert max(len(json.dumps(t, separators=(",", ":"))) for t in tasks) < 8 << 10
        await controller.check_unharmed()
    finally:
        with anyio.CancelScope(shield=True):
            # While the controller runs, which takes the Tasks' finalizers off.
            await controller.kubectl("delete", "diagnosis", "-n", "default", name, "--ignore-not-found")
            await controller.kubectl("delete", "operationset", operation_set, "--ignore-not-found")
            await controller.kubectl("delete", "operation", operation, "--ignore-not-found")
            await controller.kubectl("delete", "node", *edges, "--ignore-not-found")


async def _listed(controller: Controller, *args: str) -> list[dict[str, Any]]:
    found = await controller.kubectl("get", *args, "-o", "json")
    assert found.returncode == 0, found.stderr
    items: list[dict[str, Any]] = json.loads(found.stdout)["items"]
    return items
