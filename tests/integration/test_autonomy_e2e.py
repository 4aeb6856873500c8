"""Edge autonomy end to end: the controller, a hub and an agent with its local API as real processes.

No kubelet runs here: the Pods are created already bound to the node (``spec.nodeName``). The
device's side is read as a program on it would: ``kubectl --server=http://127.0.0.1:<port>``
(the binary the suite provisions) and plain HTTP against the agent's local API.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import psutil
import pytest
import yaml

from nodetask.autonomy import AUTONOMY_ANNOTATION, CONDITION_TYPE, STATUS_LABEL
from roles.kube import Kube
from roles.kube.resources import EVENTS, NODES
from schemas.core import Node, NodeCondition
from tests.integration.agents import write_agent_config
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.full_disk import fill
from tests.integration.objects import kubectl, polled, unique
from tests.integration.processes import fleet
from tests.integration.tmpfs import on_tmpfs, seen_by, usable
from tools.ports import free_port
from tools.processes import terminate

pytestmark = [pytest.mark.integration, pytest.mark.slow(100)]
NS = "default"
REPO = Path(__file__).resolve().parents[2]
CACHE_SECRETS_RBAC = REPO / "containers" / "rbac" / "cache-secrets"


@pytest.fixture
def secrets_cached(crds: ControlPlane) -> Iterator[ControlPlane]:
    """The hubs' extra RBAC for cacheSecrets, bound while the test runs (and the ServiceAccount Pods need)."""
    # Pod admission wants the namespace's default ServiceAccount; the controller manager may not have made it yet.
    crds.kubectl("create", "serviceaccount", "default", "-n", NS, check=False)
    crds.kubectl("apply", "-k", str(CACHE_SECRETS_RBAC))
    try:
        yield crds
    finally:
        crds.kubectl("delete", "-k", str(CACHE_SECRETS_RBAC))


# ---------------------------------------------------------------------------------- the cloud's objects


def pod_doc(
    name: str, node: str, *, config_map: str, secret: str = "", annotations: dict[str, str] | None = None
) -> Any:
    """A Pod bound to ``node`` that mounts ``config_map`` and reads ``secret`` (when given) into its environment."""
    container: dict[str, Any] = {"name": "app", "image": "registry.local/app:1"}
    if secret:
        container["env"] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}]
    spec = {
        "nodeName": node,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": config_map}}],
    }
    meta = {"name": name, "namespace": NS, "annotations": annotations or {}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def config_map_doc(name: str, value: str) -> Any:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}, "data": {"v": value}}


def secret_doc(name: str) -> Any:
    meta = {"name": name, "namespace": NS}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": {"token": name}}


async def apply(cp: ControlPlane, *docs: Any, verb: str = "apply") -> None:
    """``kubectl apply`` (or ``create``: no copy of the object in an annotation) of ``docs`` as admin."""
    await kubectl(cp, verb, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))


async def request_autonomy(kube: Kube, node: str) -> None:
    await kube.merge_patch(NODES, node, {"metadata": {"annotations": {AUTONOMY_ANNOTATION: "true"}}})


def autonomy_of(node: Node) -> NodeCondition | None:
    return next((c for c in node.status.conditions if c.type == CONDITION_TYPE), None)


async def approved(kube: Kube, node: str, status: str, label: str | None) -> Node:
    """The Node once its Autonomy condition has ``status`` and the controller's label says ``label`` (None: none)."""

    def done(found: Node) -> bool:
        condition = autonomy_of(found)
        return condition is not None and condition.status == status and found.metadata.labels.get(STATUS_LABEL) == label

    return await polled(functools.partial(kube.get, NODES, node), done, limit_s=120)


# ------------------------------------------------------------------------------------- the device's side


@dataclass(frozen=True)
class Device:
    """How a program on the device reaches the agent's local API."""

    port: int
    kubectl_path: Path
    home: Path

    def get(self, path: str) -> tuple[int, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())
        except OSError:
            return 0, None  # not listening yet

    async def read(self, path: str) -> tuple[int, Any]:
        return await anyio.to_thread.run_sync(self.get, path)

    def argv(self, *args: str) -> list[str]:
        return [str(self.kubectl_path), f"--server=http://127.0.0.1:{self.port}", f"--cache-dir={self.home}/kc", *args]

    def env(self) -> dict[str, str]:
        # No kubeconfig of the machine's may point kubectl elsewhere or add credentials.
        return {"PATH": "/usr/bin:/bin", "HOME": str(self.home), "KUBECONFIG": str(self.home / "none")}

    async def kubectl(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        with anyio.fail_after(60):
            return await anyio.run_process(self.argv(*args), check=False, env=self.env())


def local_api(port: int, *, serve_secrets: bool) -> dict[str, object]:
    return {"localApi": {"enabled": True, "port": port, "serveSecrets": serve_secrets}}


def table(out: bytes) -> list[list[str]]:
    """kubectl's table output as rows of cells, header first."""
    return [line.split() for line in out.decode().splitlines()]


# ----------------------------------------------------------------------------------------------- tests


async def test_kubectl_reads_the_devices_cache_while_its_hub_is_down_and_sees_a_change_once_it_is_back(
    secrets_cached: ControlPlane, tmp_path: Path
) -> None:
    """An agent with the local API caches its node's Node, Pods, ConfigMap and Secret from a real hub
    (condition True, label true); with the hub stopped, kubectl still gets the node, lists its Pods by
    field selector, reads the ConfigMap and Secret, and is refused a delete with 403, while a watch stays
    open; with the hub back the watch ends (so clients relist), what changed meanwhile (a Pod deleted, the
    ConfigMap) is on the device, and so is a change made afterwards; a withdrawn request turns the
    condition False and takes the label off."""
    cp = secrets_cached
    port = free_port()
    device = Device(port=port, kubectl_path=cp.binaries.kubectl, home=tmp_path / "device")
    device.home.mkdir()
    options = functools.partial(local_api, port, serve_secrets=True)
    async with (
        fleet(
            cp, tmp_path, edges=1, hubs=1, hub_options={"cacheSecrets": True}, edge_options=lambda _: options()
        ) as running,
        admin(cp) as kube,
    ):
        (node,) = running.edges
        conf, secret = unique("conf"), unique("token")
        pods = sorted(unique("app") for _ in range(2))
        await apply(
            cp,
            config_map_doc(conf, "one"),
            secret_doc(secret),
            *(pod_doc(name, node, config_map=conf, secret=secret) for name in pods),
        )
        await request_autonomy(kube, node)

        cached = [
            f"/api/v1/namespaces/{NS}/configmaps/{conf}",
            f"/api/v1/namespaces/{NS}/secrets/{secret}",
            *(f"/api/v1/namespaces/{NS}/pods/{name}" for name in pods),
        ]

        async def all_cached() -> list[int]:
            return [(await device.read(path))[0] for path in cached]

        await polled(all_cached, lambda codes: codes == [200] * len(cached), limit_s=60)
        found = await approved(kube, node, "True", "true")
        condition = autonomy_of(found)
        assert condition is not None
        assert condition.reason == "autonomy enabled successfully"

        hub = running.hubs[0]
        await hub.stop()
        assert not hub.alive

        result = await device.kubectl("get", "node")
        assert result.returncode == 0, result.stderr
        assert table(result.stdout)[1][0] == node
        result = await device.kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}")
        assert result.returncode == 0, result.stderr
        assert [row[:2] for row in table(result.stdout)[1:]] == [[NS, name] for name in pods]
        result = await device.kubectl("get", "configmap", "-n", NS, conf, "-o", "yaml")
        assert result.returncode == 0, result.stderr
        assert yaml.safe_load(result.stdout)["data"] == {"v": "one"}
        result = await device.kubectl("get", "secret", "-n", NS, secret, "-o", "jsonpath={.data.token}")
        assert result.returncode == 0, result.stderr
        assert result.stdout.decode() == secret_b64(secret)
        result = await device.kubectl("delete", "configmap", "-n", NS, conf)
        assert result.returncode != 0
        assert result.stderr.decode().startswith("Error from server (Forbidden)"), result.stderr

        # Changed in the cloud while the device is cut off: the relist after the reconnect brings them.
        await kubectl(cp, "delete", "pod", "-n", NS, pods[1], "--grace-period=0", "--force")
        await apply(cp, config_map_doc(conf, "two"))
        # A watch opened offline stays open until the cloud is back and has relisted.
        watch = await anyio.open_process(device.argv("get", "configmaps", "-n", NS, "-w", "-v=6"), env=device.env())
        try:
            await watching(watch)
            assert watch.returncode is None
            await hub.start()
            with anyio.fail_after(120):
                assert await watch.wait() == 0
        finally:
            await terminate(watch, grace=5)
            await watch.aclose()

        async def on_device() -> tuple[Any, int]:
            conf_found = (await device.read(f"/api/v1/namespaces/{NS}/configmaps/{conf}"))[1]
            return conf_found["data"], (await device.read(f"/api/v1/namespaces/{NS}/pods/{pods[1]}"))[0]

        await polled(on_device, lambda found: found == ({"v": "two"}, 404), limit_s=60)
        # Changed once the device is back: the watch of the hub's cache stream brings it.
        await apply(cp, config_map_doc(conf, "three"))
        await polled(on_device, lambda found: found == ({"v": "three"}, 404), limit_s=60)
        await approved(kube, node, "True", "true")

        # Autonomy withdrawn: the condition turns False and the controller takes its label off.
        await kube.merge_patch(NODES, node, {"metadata": {"annotations": {AUTONOMY_ANNOTATION: None}}})
        found = await approved(kube, node, "False", None)
        condition = autonomy_of(found)
        assert condition is not None
        assert condition.reason == "autonomy disabled"


async def watching(process: anyio.abc.Process) -> None:
    """Return once kubectl (run with ``-v=6``) has had the 200 of its watch request: the local API holds it."""
    assert process.stderr is not None
    seen = b""
    with anyio.fail_after(60):
        async for chunk in process.stderr:
            seen += chunk
            if any(b"watch=true 200 OK" in line for line in seen.splitlines()):
                return
    raise AssertionError(f"kubectl's watch never started: {seen.decode(errors='replace')[-2000:]}")


def secret_b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


TMPFS_BYTES: Final = 8 * 1024 * 1024
"""The agent's data directory: room for its store, ledger and a few objects, then filled up by the test."""
ANNOTATION_BYTES: Final = 150 * 1024
"""Each Pod made while the disk is full carries this much: no write of one fits in what a full tmpfs has left."""
QUICK_AUTONOMY: Final[dict[str, object]] = {"checkPeriod": 2, "repairPeriod": 1}
"""The full-disk agents' ``autonomy``: the fourth failing check comes within seconds (10 s apart by default)."""
QUICK_CONDITIONS: Final[dict[str, object]] = {"autonomyConditionInterval": 1}
"""Their hub's: it writes each check's change at once (one write a node per 10 s by default)."""


def agent_log(path: Path) -> list[dict[str, Any]]:
    """The agent's log lines (``logFormat: json``)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def condition_changes(log: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """Each change of the condition the agent made: its status and the failing checks behind it."""
    return [(e["status"], e["failing_checks"]) for e in log if e["event"] == "autonomy_condition_changed"]


@asynccontextmanager
async def supervised_on_tmpfs(config: Path, data: Path, log: Path) -> AsyncIterator[anyio.abc.Process]:
    """The agent under its launcher (which restarts it when it dies), both in a namespace where ``data`` is a
    tmpfs of :data:`TMPFS_BYTES`; their output goes to ``log``."""
    command = [*on_tmpfs(data, TMPFS_BYTES), sys.executable, "-m", "roles.edge.launcher", f"--config={config}"]
    # The launcher starts the agent with -P (the working directory off sys.path): this checkout goes
    # first on PYTHONPATH, or the agent would be whichever one the virtualenv was installed from.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    with log.open("ab") as out:
        launcher = await anyio.open_process(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield launcher
    finally:
        await terminate(launcher)


async def agent_of(launcher: anyio.abc.Process) -> psutil.Process:
    """The agent process the launcher runs now."""

    async def children() -> list[psutil.Process]:
        return psutil.Process(launcher.pid).children()

    (agent,) = await polled(children, lambda found: len(found) == 1, limit_s=60)
    return agent


def loaded_ledgers(log: list[dict[str, Any]]) -> list[tuple[int, bool]]:
    """Each time an agent started with errored keys in its ledger: how many, and whether the file holds them."""
    return [(e["error_keys"], e["persisted"]) for e in log if e["event"] == "ledger_loaded"]


async def test_a_full_disk_turns_autonomy_unknown_on_the_fourth_failing_check_and_the_repair_loop_restores_it(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """An agent whose data directory is a small tmpfs, filled up: the Pods then bound to its node cannot
    be cached, their keys are errored, and only the fourth failing check turns the Node's Autonomy
    condition Unknown (a Warning Event, the label false); the agent killed and restarted on the full disk
    finds the keys in its ledger; once space is freed the repair loop fetches them again with nothing
    changed in the cloud, and the condition is True and the label true."""
    cp = crds
    usable(tmp_path)
    cp.kubectl("create", "serviceaccount", "default", "-n", NS, check=False)
    node = unique("full")
    tokens = await register_edges(cp, [node])
    port = free_port()
    device = Device(port=port, kubectl_path=cp.binaries.kubectl, home=tmp_path / "device")
    home = tmp_path / node
    data, log = home / "data", home / "agent.log"
    async with fleet(cp, tmp_path, edges=0, hubs=1, hub_options=QUICK_CONDITIONS) as running, admin(cp) as kube:
        conf = unique("conf")
        await apply(cp, config_map_doc(conf, "one"), pod_doc(unique("small"), node, config_map=conf))
        await request_autonomy(kube, node)
        data.mkdir(parents=True)
        config = write_agent_config(
            home,
            node=node,
            token=tokens[node],
            hub_urls=running.hub_urls,
            logFormat="json",
            autonomy=QUICK_AUTONOMY,
            **local_api(port, serve_secrets=False),
        )
        async with supervised_on_tmpfs(config, data, log) as launcher:
            await approved(kube, node, "True", "true")

            filler = seen_by(launcher.pid, data / "filler")
            assert await anyio.to_thread.run_sync(fill, filler) > 0
            big = sorted(unique("big") for _ in range(3))
            filled = {"filler": "x" * ANNOTATION_BYTES}
            await apply(cp, *(pod_doc(name, node, config_map=conf, annotations=filled) for name in big), verb="create")

            found = await approved(kube, node, "Unknown", "false")
            condition = autonomy_of(found)
            assert condition is not None
            assert condition.reason == "cache failed"
            for name in big:
                assert f"Pod/{NS}/{name}" in condition.message
            assert "database or disk is full" in condition.message
            changes = condition_changes(agent_log(log))
            assert [status for status, _ in changes] == ["False", "True", "Unknown"]
            assert changes[-1] == ("Unknown", 4)

            # The hub records the Event after the condition's write, so it may land a moment after it.
            async def warnings() -> list[tuple[str, str]]:
                events, _, _ = await kube.list(EVENTS, namespace=NS, field_selector=f"involvedObject.name={node}")
                return [(e.reason, e.type) for e in events if e.reason == "AutonomyUnknown"]

            assert await polled(warnings, bool) == [("AutonomyUnknown", "Warning")]

            # A crash on the full disk: the launcher starts the agent again, which finds the keys it lost.
            killed = await agent_of(launcher)
            killed.kill()

            async def relisted() -> list[dict[str, Any]]:
                return [e for e in agent_log(log) if e["event"] == "cache_relisted"]

            # Its session's relist is written to the full disk (or not) before space is freed: whatever
            # is stored afterwards comes from the repair loop.
            await polled(relisted, lambda found: len(found) == 2, limit_s=60)
            (loaded,) = loaded_ledgers(agent_log(log))
            assert loaded[0] >= len(big)
            assert loaded[1] is True
            assert (await agent_of(launcher)).pid != killed.pid

            await anyio.to_thread.run_sync(filler.unlink)
            await approved(kube, node, "True", "true")
            entries = agent_log(log)
            assert condition_changes(entries)[-1] == ("True", 0)
            since_relist = entries[entries.index((await relisted())[-1]) :]
            repaired = next(i for i, e in enumerate(since_relist) if e["event"] == "cache_repair")
            cleared = next(i for i, e in enumerate(since_relist) if e.get("error_keys") == 0)
            assert repaired < cleared
            status, pods = await device.read(f"/api/v1/namespaces/{NS}/pods?fieldSelector=spec.nodeName%3D{node}")
            assert status == 200
            assert sorted(p["metadata"]["name"] for p in pods["items"] if p["metadata"]["name"] in big) == big
