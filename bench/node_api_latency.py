"""Issue 25's device rows: what the node API endpoint adds to a kubelet's requests, and what it costs.

The real processes on loopback: the benchmark's API server, a hub (the cloud role) with ``apiRelay``
on, and an agent (the edge role, run by the device interpreter of :mod:`bench.edge_device`) with
``nodeApi`` on and the node's client certificate in its ``credentialsDir`` (issued here by the
cluster CA, as the CSR API would issue it). The node has 10 Pods bound to it (the API server's own
objects, about 4 KiB of JSON each). For each run, a fresh hub and agent:

1. Latency, side by side: two keep-alive connections held as a kubelet holds them, one to the agent's
   endpoint (plain HTTP on 127.0.0.1; the agent relays over TLS through its hub session and the hub's
   tunnel), one straight to the API server over TLS with the same node certificate. After a warm-up,
   ``rounds`` rounds each ask ``GET /api/v1/nodes/<node>`` and ``GET /api/v1/pods?fieldSelector=
   spec.nodeName=<node>`` both ways, the order alternating between rounds; each time is the client's, from
   sending to the parsed end of the answer (h11). The added latency is the relayed median minus the
   direct median.
2. CPU per relayed request: the hub's and the agent's CPU time over ``cpu_requests`` relayed requests
   (the two above, alternating) divided by their number, their idle rate (measured just before)
   taken off; and the tunnel bytes the hub relayed per request, up and down (its metric).
3. Memory at rest: the agent's RSS, USS and PSS ``settle_s`` after that, its endpoint serving and its
   relay's connections kept (median of three readings a second apart).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import h11
import msgspec
import trio

from bench import cluster, procs, store
from bench.cluster import REPO, edge_token, node_name
from bench.edge_device import Memory, device_python, repo_env, settled_memory
from bench.hub_process import bound_ports, hub_ready, read_metrics, write_config
from bench.local_api import realistic_pod
from bench.waits import Stalled
from roles.edge.node_api.credentials import CA_FILE, CERT_FILE, KEY_FILE, load_node_tls
from tools.ports import free_port
from tools.processes import role_command, terminate
from tools.provision.controlplane import ControlPlane

NODE = node_name(0)
PODS = 10
TARGETS = {
    "get node": f"/api/v1/nodes/{NODE}",
    "list pods (spec.nodeName)": f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}",
}
WARM_UP = 50
BYTES_UP, BYTES_DOWN = "nodetaskd_hub_tunnel_bytes_total:up", "nodetaskd_hub_tunnel_bytes_total:down"


@dataclass(frozen=True, slots=True)
class Timing:
    median_ms: float
    p90_ms: float
    p99_ms: float


@dataclass(frozen=True, slots=True)
class LatencyRun:
    relayed: dict[str, Timing]
    direct: dict[str, Timing]
    added_median_ms: dict[str, float]
    rounds: int
    hub_cpu_ms_per_request: float
    agent_cpu_ms_per_request: float
    tunnel_bytes_up_per_request: float
    tunnel_bytes_down_per_request: float
    cpu_requests: int
    agent: Memory
    """The agent's memory at rest after serving, its endpoint on."""
    tls_connections: int
    """Tunnels the hub opened in the run (the agent's TLS connections to the API server: reuse keeps it low)."""


def timing(times: list[float]) -> Timing:
    ordered = sorted(times)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 3)

    return Timing(median_ms=round(statistics.median(ordered) * 1000, 3), p90_ms=at(0.9), p99_ms=at(0.99))


def ensure_pods(cp: ControlPlane) -> None:
    """The node's 10 Pods (bound to it, so that its list has them; no kubelet runs them)."""
    items = []
    for i in range(PODS):
        pod = realistic_pod(i)
        meta = {k: v for k, v in pod["metadata"].items() if k in ("name", "namespace", "labels", "annotations")}
        items.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {**pod["spec"], "nodeName": NODE}})
    cp.kubectl(
        "apply", "-f", "-", input=msgspec.json.encode({"apiVersion": "v1", "kind": "List", "items": items}).decode()
    )


def credentials(cp: ControlPlane, directory: Path) -> Path:
    """The node's certificate, key and the cluster CA as the agent keeps them in ``credentialsDir``."""
    pair = cp.node_certificate(NODE, directory / "issued")
    out = directory / "node-credentials"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(pair.cert, out / CERT_FILE)
    shutil.copy(pair.key, out / KEY_FILE)
    shutil.copy(cp.ca_file, out / CA_FILE)
    return out


@contextlib.asynccontextmanager
async def relaying_hub(cp: ControlPlane, home: Path) -> AsyncIterator[tuple[anyio.abc.Process, dict[str, int]]]:
    """A hub process relaying tunnels to the API server; its process and bound ports."""
    config, ports_file = home / "hub.yaml", home / "hub-ports.json"
    write_config(cp, config, hub_id="bench-relay", port=0, http_port=0, ports_file=ports_file)
    with config.open("a") as out:
        out.write("apiRelay:\n  enabled: true\n  nodeCertificates: false\n")
    process = await anyio.open_process(
        [*role_command("cloud", config)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        ports = await bound_ports(ports_file, process)
        await hub_ready(ports["httpListen"], process)
        yield process, ports
    finally:
        with trio.CancelScope(shield=True):
            await terminate(process)
            await process.aclose()


@contextlib.asynccontextmanager
async def logged_process(log: Path, *argv: str) -> AsyncIterator[anyio.abc.Process]:
    """``argv`` run with this repository's code, its output to ``log`` (read when a wait fails); stopped at the end."""
    with log.open("ab") as out:
        process = await anyio.open_process(list(argv), cwd=REPO, env=repo_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        with anyio.CancelScope(shield=True):
            await terminate(process)
            await process.aclose()


def agent_config(home: Path, *, seed: str, hub_port: int, api_port: int, creds: Path) -> Path:
    (home / "token").write_text(edge_token(seed, NODE))
    config = {
        "nodeName": NODE,
        "hubUrls": [f"ws://127.0.0.1:{hub_port}"],
        "tokenFile": str(home / "token"),
        "dataDir": str(home / "data"),
        "criEndpoint": "",
        "maxCpuUsage": 100,
        "maxMemUsage": 100,
        "maxDiskUsage": 100,
        "nodeApi": {"enabled": True, "port": api_port, "credentialsDir": str(creds), "serverName": "127.0.0.1"},
    }
    path = home / "edge.yaml"
    path.write_bytes(msgspec.yaml.encode(config))
    return path


class Client:
    """One keep-alive HTTP/1.1 connection (plain or TLS), as a kubelet holds one; a request at a time."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._conn = h11.Connection(h11.CLIENT)

    async def get(self, target: str) -> tuple[int, dict[str, str], bytes]:
        """The status, headers and body of ``GET target``."""
        request = h11.Request(method="GET", target=target, headers=[("host", "127.0.0.1")])
        await self._stream.send_all((self._conn.send(request) or b"") + (self._conn.send(h11.EndOfMessage()) or b""))
        status, headers, body = 0, {}, bytearray()
        while True:
            event = self._conn.next_event()
            if event is h11.NEED_DATA:
                self._conn.receive_data(bytes(await self._stream.receive_some(1 << 16)))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                self._conn.start_next_cycle()
                return status, headers, bytes(body)


async def _timed(client: Client, target: str) -> float:
    started = time.perf_counter()
    status, _, body = await client.get(target)
    took = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"GET {target}: {status} {body[:300]!r}")
    return took


async def _relaying(api_port: int, limit_s: float = 90) -> None:
    """Once the endpoint answers the Node from the API server itself (its flow-control header), not from the cache."""
    last = "nothing"
    with trio.move_on_after(limit_s):
        while True:
            try:
                async with await trio.open_tcp_stream("127.0.0.1", api_port) as stream:
                    status, headers, body = await Client(stream).get(TARGETS["get node"])
            except OSError as exc:
                last = str(exc)
            else:
                if status == 200 and "x-kubernetes-pf-flowschema-uid" in headers:
                    return
                last = f"{status} {headers} {body[:200]!r}"
            await trio.sleep(0.5)
    raise Stalled(f"waited {limit_s:.0f} s for the agent's endpoint to relay to the API server (last: {last})")


async def one_run(
    cp: ControlPlane, seed: str, *, rounds: int, cpu_requests: int, settle_s: float, python: Path
) -> LatencyRun:
    """A fresh hub and agent: the latency side by side, the CPU per relayed request, the agent at rest."""
    with tempfile.TemporaryDirectory(prefix="ntd-nodeapi-") as tmp:
        home = Path(tmp)
        creds = credentials(cp, home)
        tls = load_node_tls(creds, "127.0.0.1")
        server = cp.server.removeprefix("https://")
        api_host, _, api_port_text = server.partition(":")
        async with relaying_hub(cp, home) as (hub, ports):
            api_port = free_port()
            config = agent_config(home, seed=seed, hub_port=ports["listen"], api_port=api_port, creds=creds)
            argv = (*role_command("edge", config, python=python), "--log-level=warning")
            async with logged_process(home / "agent.log", *argv) as agent:
                try:
                    await _relaying(api_port)
                except Stalled as exc:
                    tail = (home / "agent.log").read_text()[-1500:]
                    raise Stalled(f"{exc}; the agent's log ends: {tail}") from None
                relayed_stream = await trio.open_tcp_stream("127.0.0.1", api_port)
                direct_stream = await trio.open_ssl_over_tcp_stream(
                    api_host, int(api_port_text), ssl_context=tls.context, https_compatible=True
                )
                async with relayed_stream, direct_stream:
                    relayed, direct = Client(relayed_stream), Client(direct_stream)
                    times: dict[tuple[str, str], list[float]] = {}
                    for target in TARGETS.values():
                        for _ in range(WARM_UP):
                            await _timed(relayed, target)
                            await _timed(direct, target)
                    for index in range(rounds):
                        pair = [("relayed", relayed), ("direct", direct)]
                        for way, client in pair if index % 2 else pair[::-1]:
                            for name, target in TARGETS.items():
                                times.setdefault((way, name), []).append(await _timed(client, target))
                    pids = {"hub": hub.pid, "agent": agent.pid}
                    idle_before = procs.cpu_seconds(pids)
                    await trio.sleep(5)
                    idle_after = procs.cpu_seconds(pids)
                    idle_rate = {k: v / 5 for k, v in procs.cpu_delta(idle_before, idle_after).items()}
                    metrics_before = await read_metrics(ports["httpListen"])
                    cpu_before, started = procs.cpu_seconds(pids), time.perf_counter()
                    targets = list(TARGETS.values())
                    for index in range(cpu_requests):
                        await _timed(relayed, targets[index % len(targets)])
                    cpu_used = procs.cpu_delta(cpu_before, procs.cpu_seconds(pids))
                    took = time.perf_counter() - started
                    metrics_after = await read_metrics(ports["httpListen"])
                await trio.sleep(settle_s)
                memory = await settled_memory(agent.pid)
        per_request = {k: (cpu_used[k] - idle_rate[k] * took) / cpu_requests * 1000 for k in cpu_used}

        def bytes_per(key: str) -> float:
            return (metrics_after.get(key, 0) - metrics_before.get(key, 0)) / cpu_requests

        return LatencyRun(
            relayed={name: timing(times[("relayed", name)]) for name in TARGETS},
            direct={name: timing(times[("direct", name)]) for name in TARGETS},
            added_median_ms={
                name: round(
                    statistics.median(times[("relayed", name)]) * 1000
                    - statistics.median(times[("direct", name)]) * 1000,
                    3,
                )
                for name in TARGETS
            },
            rounds=rounds,
            hub_cpu_ms_per_request=round(per_request["hub"], 4),
            agent_cpu_ms_per_request=round(per_request["agent"], 4),
            tunnel_bytes_up_per_request=round(bytes_per(BYTES_UP), 1),
            tunnel_bytes_down_per_request=round(bytes_per(BYTES_DOWN), 1),
            cpu_requests=cpu_requests,
            agent=memory,
            tls_connections=int(metrics_after.get("nodetaskd_hub_tunnels_opened_total:opened", 0)),
        )


async def series(
    cp: ControlPlane, seed: str, *, runs: int, rounds: int, cpu_requests: int, settle_s: float = 5.0
) -> dict[str, Any]:
    """``runs`` fresh hubs and agents (:func:`one_run`); the stored entry."""
    await trio.to_thread.run_sync(ensure_pods, cp)
    python = await trio.to_thread.run_sync(device_python)
    results = []
    for _ in range(runs):
        run = await one_run(cp, seed, rounds=rounds, cpu_requests=cpu_requests, settle_s=settle_s, python=python)
        results.append({**asdict(run), "load": store.load_average(), "measured": store.now()})
    return {"measured": store.now(), "runs": results, "pods": PODS}


async def _main(runs: int, rounds: int, cpu_requests: int) -> None:
    with tempfile.TemporaryDirectory(prefix="nodetaskd-bench-") as tmp:
        async with cluster.control_plane(None, Path(tmp) / "cp") as cp:
            seed = cluster.fleet_seed(cp)
            async with cluster.admin(cp) as kube:
                await cluster.register_fleet(kube, count=1, sizes=[], seed=seed)
            entry = await series(cp, seed, runs=runs, rounds=rounds, cpu_requests=cpu_requests)
    sys.stdout.write(json.dumps(entry, indent=1) + "\n")


if __name__ == "__main__":
    runs, rounds, cpu_requests = (int(a) for a in sys.argv[1:4])
    trio.run(_main, runs, rounds, cpu_requests)
