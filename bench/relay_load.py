"""Issue 25's hub row: N nodes' steady kubelet traffic as tunnels through ONE hub, and the hub's CPU for it.

Simulated at the protocol level (a real kubelet's TLS to a real API server, 10,000 times over, is
more than this machine holds): the hub is the real cloud role (through :mod:`bench.hubproc`) with
``apiRelay`` on, its sessions authenticated and marked on their Nodes against the benchmark's API
server; its kubeconfig names :mod:`bench.api_standin`, which passes the hub's own TLS through to that
API server and answers the tunnels itself. The nodes are :mod:`bench.tunnel_fleet` edges speaking the
session protocol (Hello with ``tunnel.v1``, TunnelOpen, data frames, credit): each holds a request
tunnel and ``watches`` watch tunnels, renews its lease every 10 s (a request and an answer of a lease
PUT's size inside TLS), updates its node status every 60 s (5x the kubelet's default report period),
and each watch gets a bookmark a minute. What is not simulated: TLS inside the tunnels (the hub relays
ciphertext unread, so only the byte counts matter to it) and the API server's own work.

For each size, a fresh stand-in, hub and fleet: once every tunnel is open and ``settle_s`` more have
passed, the hub's CPU over ``steady_s`` seconds, as a share of one core; the requests answered in that
window and their round trips as the fleet saw them; the hub's RSS and open tunnels.
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from bench import cluster, procs
from bench.cluster import REPO
from bench.hub_process import bound_ports, hub_ready, read_metrics, write_config
from bench.waits import Stalled
from tools.processes import role_command, terminate
from tools.provision.controlplane import ControlPlane

STEADY_S = 60.0
SIZES = {"lease_bytes": 700, "lease_answer_bytes": 800}
"""A lease renewal's bytes and its answer's, as the fleet's defaults send them (:mod:`bench.tunnel_fleet`)."""
NOFILE = 400_000
"""Descriptors each process may hold: a tunnel is one socket in the hub and one in the stand-in."""


@dataclass(frozen=True, slots=True)
class RelayRun:
    nodes: int
    watches: int
    tunnels: int
    ready_s: float
    refused: int
    """Tunnel opens the hub refused while the fleet opened them all (each asked again): why in ``refused_first``."""
    refused_first: list[str]
    steady_s: float
    hub_cpu_share: float
    """The hub's CPU seconds per second over the steady window (1.0: one core)."""
    fleet_cpu_share: float
    standin_cpu_share: float
    requests_per_s: float
    median_ms: float
    p99_ms: float
    hub_rss: int


def raise_nofile() -> None:
    """Raise this process's descriptor limit (soft and hard, as root may) so that its children inherit it.

    Where the hard limit cannot be raised (this machine's containers: 20,000), the hub holds sessions and
    tunnels up to it, one descriptor each: past it, its connects fail and it closes the tunnels asked for.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, NOFILE), max(hard, NOFILE)))


class Lines:
    """JSON lines from a child's stdout."""

    def __init__(self, process: anyio.abc.Process, what: str, log: Path) -> None:
        assert process.stdout is not None
        self._out = BufferedByteReceiveStream(process.stdout)
        self._what = what
        self._log = log

    async def expect(self, event: str, limit_s: float) -> dict[str, Any]:
        with anyio.move_on_after(limit_s):
            while True:
                try:
                    line = await self._out.receive_until(b"\n", 1 << 20)
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    tail = self._log.read_text()[-1500:]
                    raise Stalled(f"{self._what} exited before {event!r}; its log ends: {tail}") from None
                msg: dict[str, Any] = json.loads(line)
                if msg.get("event") == event:
                    return msg
        raise Stalled(f"waited {limit_s:.0f} s for {self._what} to say {event!r}")


@contextlib.asynccontextmanager
async def child(argv: list[str], log: Path) -> AsyncIterator[anyio.abc.Process]:
    with log.open("ab") as err:
        process = await anyio.open_process(argv, cwd=REPO, stderr=err)
    try:
        yield process
    finally:
        with anyio.CancelScope(shield=True):
            if process.stdin is not None:
                await process.stdin.aclose()
            await terminate(process)
            await process.aclose()


async def run_size(
    cp: ControlPlane, seed: str, home: Path, *, nodes: int, watches: int = 6, settle_s: float = 15.0,
    steady_s: float = STEADY_S,
) -> RelayRun:  # fmt: skip
    raise_nofile()
    await anyio.Path(home).mkdir(parents=True, exist_ok=True)
    api = cp.server.removeprefix("https://")
    standin_argv = [sys.executable, "-m", "bench.api_standin", f"--upstream={api}"]
    async with child(standin_argv, home / "standin.log") as standin:
        port = (await Lines(standin, "the API stand-in", home / "standin.log").expect("listening", 30))["port"]
        kubeconfig = home / "hub.kubeconfig"
        kubeconfig.write_text(cp.kubeconfig("cloud").read_text().replace(cp.server, f"https://127.0.0.1:{port}"))
        config, ports_file = home / "hub.yaml", home / "hub-ports.json"
        write_config(cp, config, hub_id="bench-relay", port=0, http_port=0, sessions=nodes, ports_file=ports_file)
        text = config.read_text().replace(str(cp.kubeconfig("cloud")), str(kubeconfig))
        config.write_text(text + "apiRelay:\n  enabled: true\n  nodeCertificates: false\n")
        hub_argv = role_command("cloud", config, module="bench.hubproc")
        async with child(hub_argv, home / "hub.log") as hub:
            ports = await bound_ports(ports_file, hub)
            await hub_ready(ports["httpListen"], hub)
            fleet_argv = [
                sys.executable, "-m", "bench.tunnel_fleet", f"--url=ws://127.0.0.1:{ports['listen']}",
                f"--seed={seed}", f"--count={nodes}", f"--watches={watches}",
            ]  # fmt: skip
            async with child(fleet_argv, home / "fleet.log") as fleet:
                assert fleet.stdin is not None
                lines = Lines(fleet, f"the fleet of {nodes} tunnel edges", home / "fleet.log")
                ready = await lines.expect("ready", 900)
                await anyio.sleep(settle_s)
                pids = {"hub": hub.pid, "fleet": fleet.pid, "standin": standin.pid}
                await fleet.stdin.send(b"stats\n")
                await lines.expect("stats", 30)
                before, started = procs.cpu_seconds(pids), time.perf_counter()
                await anyio.sleep(steady_s)
                used = procs.cpu_delta(before, procs.cpu_seconds(pids))
                took = time.perf_counter() - started
                await fleet.stdin.send(b"stats\n")
                stats = await lines.expect("stats", 30)
                metrics = await read_metrics(ports["httpListen"])
                rss = procs.rss_bytes(hub.pid)
    return RelayRun(
        nodes=nodes,
        watches=watches,
        tunnels=int(metrics.get("nodetaskd_hub_tunnels", ready["tunnels"])),
        ready_s=round(ready["seconds"], 1),
        refused=ready["refused"],
        refused_first=ready["refused_first"],
        steady_s=round(took, 1),
        hub_cpu_share=round(used["hub"] / took, 4),
        fleet_cpu_share=round(used["fleet"] / took, 4),
        standin_cpu_share=round(used["standin"] / took, 4),
        requests_per_s=round(stats["requests"] / stats["seconds"], 1),
        median_ms=stats["median_ms"],
        p99_ms=stats["p99_ms"],
        hub_rss=rss,
    )


async def _main(nodes: int) -> None:
    with tempfile.TemporaryDirectory(prefix="nodetaskd-bench-") as tmp:
        async with cluster.control_plane(None, Path(tmp) / "cp") as cp:
            seed = cluster.fleet_seed(cp)
            async with cluster.admin(cp) as kube:
                await cluster.register_fleet(kube, count=nodes, sizes=[], seed=seed)
            run = await run_size(cp, seed, Path(tmp) / "relay", nodes=nodes, steady_s=30)
            sys.stdout.write(json.dumps(asdict(run)) + "\n")
            for name in ("hub.log", "fleet.log", "standin.log"):
                sys.stdout.write(f"--- {name}\n{(Path(tmp) / 'relay' / name).read_text()[-1500:]}\n")


if __name__ == "__main__":
    anyio.run(_main, int(sys.argv[1]), backend="trio")
