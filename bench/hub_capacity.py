"""Benchmark 2: how many edge sessions one hub process holds, at what memory and CPU.

The hub is the real cloud role (``nodetaskd --role=cloud`` through :mod:`bench.hubproc`) in a
process of its own, with plain ws:// on loopback and the default 15 s heartbeat; the edges are a
:mod:`bench.fleet` process of lean edges (:mod:`bench.lean_edge`: the protocol over a bare socket,
so that the fleet's CPU on the same two cores holds the hub back as little as it can). For each
size, a fresh hub and fleet:

1. the hub starts and syncs its job cache; its RSS is read (the baseline);
2. the fleet connects every edge, at most 200 handshakes at a time; its edges list pings, as
   today's agents do, so that they keep their sessions alive with websocket pings. Each session costs the hub a
   token check (against the watched token Secrets: no API call) and a merge patch recording the
   session on the Node. Connect time is until the last Node is marked;
3. after a 3 s settle, RSS again: (RSS - baseline) / sessions is the memory per session;
4. steady state: the hub's CPU over 30 s of heartbeats only (every edge every 15 s);
5. heartbeat burst: 20,000 heartbeats (at least 5 per edge) at once; the hub's echo rate (its counter).
   These are the Heartbeat frames of agents from before pings, which a hub still echoes;
   ping burst: as many websocket pings (each edge's next after its pong), timed until the last pong;
6. report burst: 10,000 reports (at least 2 per edge) for an existing job not targeting them. Each
   report is decoded, checked, passed through the job's coalescing status writer (one GET of the
   job per 0.2 s window; no PUT, since the change is refused) and answered. The write itself is
   what benchmark 1 measures;
7. reconnect storm: the hub is killed (SIGKILL: no session closed, no Node unmarked) and started
   again with the same hub id and ports; every edge reconnects at once (each backs off as the agent
   does while the port is closed: from 0.5 s, doubling up to 30 s, each delay drawn from the upper
   half of the ceiling). Timed from the new process's start: its /readyz, every edge welcomed
   again, every session's Node mark settled (written, or skipped since the Node names this hub and
   version already); then, three heartbeat intervals on, the sessions it opened beyond one per edge.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from bench import procs
from bench.cluster import REPO, admin
from bench.hub_process import (
    HEARTBEAT_S,
    MARKS,
    hub_ready,
    marks_settled,
    psutil_nofile,
    read_metrics,
    wait_metric,
    write_config,
)
from bench.hub_profile import Sampler
from bench.waits import Stalled, deadline_for
from roles.kube import Kube, NotFound
from roles.kube.resources import job_resource
from schemas.kinds import IMAGE_PRE_PULL_JOB
from schemas.v1alpha2 import API_VERSION
from tools.ports import free_ports
from tools.processes import role_command, terminate
from tools.provision.controlplane import ControlPlane

PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
STEADY_S = 30.0
HEARTBEAT_BURST = 20_000
"""Heartbeats in a burst, at least 5 per edge."""
REPORT_BURST = 10_000
"""Reports in a burst, at least 2 per edge."""


@dataclass(slots=True)
class CapacityRun:
    """One hub's measurements, filled in phase by phase."""

    sessions: int
    baseline_rss: int
    nofile: tuple[int, int]
    connect_s: float = 0.0
    """Fleet start to every session welcomed (as the fleet saw it)."""
    marked_s: float = 0.0
    """Fleet start to every Node marked (the hub's own connect work done)."""
    token_reads: float = 0.0
    """Token Secrets the hub read one by one while the fleet connected (labelled ones are watched)."""
    reopened: float = 0.0
    """Sessions opened again during the run (Hellos beyond one per edge): a hub too slow for its fleet."""
    rss: int = 0
    fleet_rss: int = 0
    steady_cpu_pct: float = 0.0
    """Hub CPU (% of one core) with heartbeats only."""
    steady_heartbeats_per_s: float = 0.0
    heartbeat_burst_per_s: float = 0.0
    heartbeat_burst_cpu_pct: float = 0.0
    ping_burst_per_s: float = 0.0
    ping_burst_cpu_pct: float = 0.0
    report_burst_per_s: float = 0.0
    report_burst_cpu_pct: float = 0.0
    fleet_cpu_pct: float = 0.0
    """The fleet process's CPU during the heartbeat burst (is the load generator the limit?)."""
    reconnect_ready_s: float = 0.0
    """Reconnect storm: the restarted hub's start to its /readyz answering 200."""
    reconnect_welcomed_s: float = 0.0
    """Reconnect storm: the restarted hub's start to every edge welcomed again (as the fleet saw it)."""
    reconnect_marked_s: float = 0.0
    """Reconnect storm: the restarted hub's start to every session's Node mark settled (written or skipped)."""
    reconnect_written: float = 0.0
    """Reconnect storm: Node marks the restarted hub wrote (the others it skipped)."""
    reconnect_reopened: float = 0.0
    """Reconnect storm: sessions the restarted hub opened beyond one per edge, three heartbeat intervals on."""
    reconnect_cpu_s: float = 0.0
    """Reconnect storm: the restarted hub's CPU-seconds from its start to every mark settled."""
    reconnect_fleet_cpu_s: float = 0.0
    """Reconnect storm: the fleet's CPU-seconds over the same time (its edges' handshakes share the cores)."""
    reconnect_error: str = ""
    """Why the reconnect storm did not complete (the run's other figures stand); empty when it did."""

    @property
    def per_session_bytes(self) -> float:
        return (self.rss - self.baseline_rss) / self.sessions


async def _target_job(kube: Kube, name: str) -> str:
    """A job targeting one node outside the fleet; its UID."""
    doc = {
        "apiVersion": API_VERSION,
        "kind": IMAGE_PRE_PULL_JOB.kind,
        "metadata": {"name": name},
        "spec": {"imagePrePullTemplate": {"images": ["registry.local/app:1"], "nodeNames": ["bench-absent"]}},
    }
    job = await kube.create(PREPULLS, doc)
    uid: str = job.metadata.uid
    return uid


async def run_size(
    cp: ControlPlane, *, sessions: int, seed: str, state_dir: Path, index: int, sample: Sampler | None = None
) -> CapacityRun:
    """Start a hub process and a fleet of ``sessions`` edges, measure, stop both.

    ``sample``, when given, samples the hub process during each burst (see :mod:`bench.hub_profile`).
    """
    # Picked, not learned from a port 0: the hub is killed and started again on them while the fleet's
    # thousands of reconnects take local ports from the kernel's ephemeral range, which these are below.
    port, http_port = free_ports(2)
    # Unique, so that no Node still carries this hub's mark from an earlier run: every first mark is written.
    hub_id = f"bench-cap-{sessions}-{index}-{int(time.time())}"
    cfg = state_dir / f"{hub_id}.yaml"
    write_config(cp, cfg, hub_id=hub_id, port=port, http_port=http_port, sessions=sessions)
    job = f"bench-cap-{sessions}-{index}-{int(time.time())}"
    argv = role_command("cloud", cfg, module="bench.hubproc")
    async with admin(cp) as kube:
        hub = await anyio.open_process(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fleet: procs.Fleet | None = None
        try:
            await hub_ready(http_port, hub)
            await anyio.sleep(2)
            baseline = procs.rss_bytes(hub.pid)
            fleet = await procs.Fleet.spawn(
                url=f"ws://127.0.0.1:{port}", seed=seed, count=sessions, parallel=200, lean=True
            )
            run = CapacityRun(sessions=sessions, baseline_rss=baseline, nofile=psutil_nofile(hub.pid))
            async with _sampled(sample, "connect", hub.pid):
                await _connect(run, fleet, hub.pid, http_port)
            pids = {"hub": hub.pid, "fleet": fleet.pid}
            await _steady(run, pids, http_port)
            async with _sampled(sample, "heartbeat", hub.pid):
                await _heartbeat_burst(run, fleet, pids, http_port)
            async with _sampled(sample, "ping", hub.pid):
                await _ping_burst(run, fleet, pids)
            uid = await _target_job(kube, job)
            await anyio.sleep(1)  # the hub's job watch picks the job up
            async with _sampled(sample, "report", hub.pid):
                await _report_burst(run, fleet, pids, job, uid)
            hellos = (await read_metrics(http_port)).get("nodetaskd_hub_messages_in_total:hello", 0.0)
            run.reopened = hellos - sessions
            await fleet.command("reconnects")  # the fleet counts each edge's sessions from here
            commanded = time.perf_counter()
            await _kill(hub)
            started = time.perf_counter()
            hub = await anyio.open_process(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                await _reconnect_storm(run, fleet, hub, http_port, commanded=commanded, started=started, sample=sample)
            except Stalled as exc:  # the last step: what the run measured before it still stands
                run.reconnect_error = str(exc)
        finally:
            await terminate(hub, grace=60)
            if fleet is not None:
                await fleet.aclose()
            with anyio.CancelScope(shield=True):
                await hub.aclose()
                with contextlib.suppress(NotFound):
                    await kube.delete(PREPULLS, job)
    return run


async def _kill(hub: anyio.abc.Process) -> None:
    """SIGKILL: the hub closes no session and unmarks no Node, as when its machine fails."""
    with anyio.CancelScope(shield=True):
        hub.kill()
        await hub.wait()
        await hub.aclose()


async def _reconnect_storm(
    run: CapacityRun,
    fleet: procs.Fleet,
    hub: anyio.abc.Process,
    http_port: int,
    *,
    commanded: float,
    started: float,
    sample: Sampler | None,
) -> None:
    """Time the fleet's return to ``hub``, started (``time.perf_counter``) in place of a killed one with the
    same id after the fleet was told (``commanded``) to count reconnects."""
    fleet_cpu = procs.cpu_seconds({"fleet": fleet.pid})
    async with _sampled(sample, "reconnect", hub.pid):
        await hub_ready(http_port, hub)
        run.reconnect_ready_s = time.perf_counter() - started
        limit = deadline_for(run.sessions)
        marks = await wait_metric("Nodes marked again", http_port, marks_settled, run.sessions, limit_s=limit)
        run.reconnect_marked_s = time.perf_counter() - started
        run.reconnect_cpu_s = procs.cpu_seconds({"hub": hub.pid})["hub"]
        run.reconnect_fleet_cpu_s = procs.cpu_delta(fleet_cpu, procs.cpu_seconds({"fleet": fleet.pid}))["fleet"]
    run.reconnect_written = marks.get(f"{MARKS}:written", 0.0)
    reconnected = await fleet.expect("reconnected", limit_s=limit)
    run.reconnect_welcomed_s = float(reconnected["seconds"]) - (started - commanded)
    # A session the hub was too slow for ends after three silent heartbeat intervals; its edge says Hello again.
    await anyio.sleep(3 * HEARTBEAT_S)
    hellos = (await read_metrics(http_port)).get("nodetaskd_hub_messages_in_total:hello", 0.0)
    run.reconnect_reopened = hellos - run.sessions


def _sampled(sample: Sampler | None, phase: str, pid: int) -> contextlib.AbstractAsyncContextManager[None]:
    return contextlib.nullcontext() if sample is None else sample(phase, pid)


async def _connect(run: CapacityRun, fleet: procs.Fleet, hub_pid: int, http_port: int) -> None:
    started = time.perf_counter()
    connected = await fleet.expect("connected", limit_s=deadline_for(run.sessions))
    run.connect_s = float(connected["seconds"])
    # The hub marks each Node after welcoming its edge (the hub id is new: every mark is written).
    limit = deadline_for(run.sessions)
    await wait_metric("Nodes marked", http_port, marks_settled, run.sessions, limit_s=limit)
    run.marked_s = time.perf_counter() - started
    run.token_reads = (await read_metrics(http_port)).get("nodetaskd_hub_token_reads_total", 0.0)
    await anyio.sleep(3)
    run.rss = procs.rss_bytes(hub_pid)
    run.fleet_rss = procs.rss_bytes(fleet.pid)


async def _steady(run: CapacityRun, pids: dict[str, int], http_port: int) -> None:
    m0, cpu0 = await read_metrics(http_port), procs.cpu_seconds(pids)
    await anyio.sleep(STEADY_S)
    m1, cpu1 = await read_metrics(http_port), procs.cpu_seconds(pids)
    run.steady_cpu_pct = procs.cpu_delta(cpu0, cpu1)["hub"] / STEADY_S * 100
    key = "nodetaskd_hub_messages_in_total:heartbeat"
    run.steady_heartbeats_per_s = (m1.get(key, 0.0) - m0.get(key, 0.0)) / STEADY_S


async def _heartbeat_burst(run: CapacityRun, fleet: procs.Fleet, pids: dict[str, int], http_port: int) -> None:
    key = "nodetaskd_hub_messages_out_total:heartbeat"
    each = max(5, -(-HEARTBEAT_BURST // run.sessions))
    m0, cpu0, started = await read_metrics(http_port), procs.cpu_seconds(pids), time.perf_counter()
    await fleet.command(f"heartbeats {each}")
    await fleet.expect("sent", limit_s=600)
    target = m0.get(key, 0.0) + run.sessions * each
    m1 = await wait_metric("heartbeats echoed", http_port, key, target, limit_s=600)
    elapsed, cpu = time.perf_counter() - started, procs.cpu_delta(cpu0, procs.cpu_seconds(pids))
    run.heartbeat_burst_per_s = (m1[key] - m0.get(key, 0.0)) / elapsed
    run.heartbeat_burst_cpu_pct = cpu["hub"] / elapsed * 100
    run.fleet_cpu_pct = cpu["fleet"] / elapsed * 100


async def _fleet_burst(fleet: procs.Fleet, pids: dict[str, int], command: str, done: str) -> tuple[float, float]:
    """Run one fleet burst; its seconds (as the fleet timed them) and the hub's CPU as a percentage of one core."""
    cpu0 = procs.cpu_seconds(pids)
    await fleet.command(command)
    finished = await fleet.expect(done, limit_s=900)
    cpu = procs.cpu_delta(cpu0, procs.cpu_seconds(pids))
    seconds = float(finished["seconds"])
    return seconds, cpu["hub"] / seconds * 100


async def _ping_burst(run: CapacityRun, fleet: procs.Fleet, pids: dict[str, int]) -> None:
    each = max(5, -(-HEARTBEAT_BURST // run.sessions))
    seconds, run.ping_burst_cpu_pct = await _fleet_burst(fleet, pids, f"pings {each}", "ponged")
    run.ping_burst_per_s = run.sessions * each / seconds


async def _report_burst(run: CapacityRun, fleet: procs.Fleet, pids: dict[str, int], job: str, uid: str) -> None:
    each = max(2, -(-REPORT_BURST // run.sessions))
    seconds, run.report_burst_cpu_pct = await _fleet_burst(fleet, pids, f"reports {each} {job} {uid}", "answered")
    run.report_burst_per_s = run.sessions * each / seconds
