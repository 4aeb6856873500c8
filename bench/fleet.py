"""A fleet of light edges in a process of its own: ``python -m bench.fleet --url ws://... --count N``.

The benchmarks run the edges apart from the hub so that the hub's memory and CPU are measured
alone. Each edge is a :class:`tools.doubles.lightedge.LightEdge` speaking the real protocol. The process
talks to the benchmark in JSON lines: it prints ``{"event": "connected", ...}`` once every edge is
connected, then obeys one command per stdin line:

* ``heartbeats K``: every edge sends K heartbeats at once (the hub echoes each);
* ``pings K``: every edge sends K websocket pings, one after the other's pong, and the process
  prints ``{"event": "ponged", ...}`` once every pong came back;
* ``reports K JOB UID``: every edge sends K reports for ImagePrePullJob ``JOB`` (UID ``UID``)
  and the process prints ``{"event": "answered", ...}`` once the hub has answered them all;
* ``reconnects``: print ``{"event": "reconnected", ...}`` once every edge has connected again since
  (a new session after the hub it was connected to went away), with the seconds since the command;
* ``stats``: print counters. End of input stops the process.

With ``--cache`` the edges list ``cache.v1`` and the process also prints ``{"event": "cached", ...}``
once every edge has received its Node, Pod and ConfigMap collections. With ``--lean`` the edges are
:class:`bench.lean_edge.LeanEdge` (pings only, no actions, a fifth of the CPU per connection or less) instead.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import urllib.parse
from collections.abc import Sequence

import anyio
import anyio.abc

from bench.cluster import edge_token, node_name
from bench.lean_edge import LeanEdge
from nodetask.messages import CACHE_CAPABILITY, Heartbeat, Report
from nodetask.route import Route
from roles.common.gc_tuning import tune_gc
from roles.common.jobtypes import edge_job_types
from roles.common.logs import configure_logging
from schemas import v1alpha2
from tools.doubles.lightedge import LightEdge

JOB_TYPE = "imageprepulljob"

Edge = LightEdge | LeanEdge


def _answered(edge: Edge) -> int:
    """Reports the hub has answered (acknowledged or refused)."""
    if isinstance(edge, LeanEdge):
        return edge.acked + edge.errors
    return len(edge.acked) + len(edge.errors)


def raise_fd_limit() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit; returns (soft before, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, hard


def emit(event: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def _connect_all(edges: list[Edge], tg: anyio.abc.TaskGroup, parallel: int) -> float:
    limiter = anyio.CapacityLimiter(parallel)
    started = time.perf_counter()
    async with anyio.create_task_group() as starting:

        async def start_one(edge: Edge) -> None:
            async with limiter:
                await tg.start(edge.run)

        for edge in edges:
            starting.start_soon(start_one, edge)
    return time.perf_counter() - started


async def _heartbeats(edges: list[Edge], count: int) -> None:
    started = time.perf_counter()

    async def one(edge: Edge) -> None:
        for _ in range(count):
            await edge.send(Heartbeat(sent_at=anyio.current_time()))

    async with anyio.create_task_group() as tg:
        for edge in edges:
            tg.start_soon(one, edge)
    emit("sent", messages=len(edges) * count, seconds=time.perf_counter() - started)


async def _pings(edges: list[Edge], count: int) -> None:
    started = time.perf_counter()

    async def one(edge: Edge) -> None:
        for _ in range(count):
            await edge.ping()

    async with anyio.create_task_group() as tg:
        for edge in edges:
            tg.start_soon(one, edge)
    emit("ponged", messages=len(edges) * count, seconds=time.perf_counter() - started)


async def _reports(edges: list[Edge], count: int, job: str, uid: str) -> None:
    before = sum(_answered(e) for e in edges)
    expected = before + len(edges) * count
    started = time.perf_counter()

    async def one(edge: Edge) -> None:
        route = Route(v1alpha2.API_VERSION, JOB_TYPE, job, edge.node)
        for seq in range(count):
            report = Report(route=route, job_uid=uid, seq=1_000_000 + seq, action="Check", succ=True)
            await edge.send(report)

    async with anyio.create_task_group() as tg:
        for edge in edges:
            tg.start_soon(one, edge)
    sent = time.perf_counter() - started
    # The edges only count answers as they arrive: poll them.
    while sum(_answered(e) for e in edges) < expected:  # noqa: ASYNC110
        await anyio.sleep(0.01)
    emit("answered", messages=len(edges) * count, sent_s=sent, seconds=time.perf_counter() - started)


CACHED_KINDS = ("Node", "Pod", "ConfigMap")


async def _cached(edges: list[LightEdge], started: float) -> None:
    # LightEdge only counts frames as they arrive: poll them.
    while not all(all(k in e.cache_replaces for k in CACHED_KINDS) for e in edges):  # noqa: ASYNC110
        await anyio.sleep(0.1)
    emit("cached", count=len(edges), seconds=time.perf_counter() - started, frames=sum(e.cache_frames for e in edges))


async def _reconnected(edges: list[Edge]) -> None:
    started = time.perf_counter()
    before = [edge.connects for edge in edges]
    # LightEdge only counts connects as they happen: poll them.
    while not all(e.connected and e.connects > n for e, n in zip(edges, before, strict=True)):  # noqa: ASYNC110
        await anyio.sleep(0.05)
    emit("reconnected", count=len(edges), seconds=time.perf_counter() - started)


def _stats(edges: list[Edge]) -> None:
    light = [e for e in edges if isinstance(e, LightEdge)]
    emit(
        "stats",
        connected=sum(e.connected for e in edges),
        connects=sum(e.connects for e in edges),
        answered=sum(_answered(e) for e in edges),
        run_actions=sum(len(e.run_actions) for e in light),
        outbox=sum(len(e.outbox) for e in light),
    )


async def serve(args: argparse.Namespace) -> None:
    edges: list[Edge] = [*_lean(args)] if args.lean else [*_light(args)]
    async with anyio.create_task_group() as tg:
        started = time.perf_counter()
        seconds = await _connect_all(edges, tg, args.parallel)
        emit("connected", count=len(edges), seconds=seconds)
        tune_gc()  # as a hub does: reconnecting thousands of edges must not walk all of them again and again
        if args.cache:
            await _cached([e for e in edges if isinstance(e, LightEdge)], started)
        async for line in anyio.wrap_file(sys.stdin):
            match line.split():
                case ["heartbeats", k]:
                    await _heartbeats(edges, int(k))
                case ["pings", k]:
                    await _pings(edges, int(k))
                case ["reports", k, job, uid]:
                    await _reports(edges, int(k), job, uid)
                case ["reconnects"]:
                    tg.start_soon(_reconnected, edges)
                case ["stats"]:
                    _stats(edges)
                case _:
                    emit("unknown", line=line.strip())
        tg.cancel_scope.cancel()


def _light(args: argparse.Namespace) -> list[LightEdge]:
    types = edge_job_types()
    return [
        LightEdge(
            node=node_name(i),
            url=args.url,
            token=edge_token(args.seed, node_name(i)),
            job_types=types,
            delay=args.delay,
            jitter=args.jitter,
            reconnect_delay=args.reconnect_delay,
            reconnect_cap=args.reconnect_cap,
            pings=args.pings,
            capabilities=(CACHE_CAPABILITY,) if args.cache else (),
        )
        for i in range(args.first, args.first + args.count)
    ]


def _lean(args: argparse.Namespace) -> list[LeanEdge]:
    url = urllib.parse.urlsplit(args.url)
    if url.scheme != "ws" or url.hostname is None or url.port is None:
        raise SystemExit(f"--lean takes a ws://host:port URL, not {args.url!r}")
    return [
        LeanEdge(
            node=node_name(i),
            host=url.hostname,
            port=url.port,
            token=edge_token(args.seed, node_name(i)),
            reconnect_delay=args.reconnect_delay,
            reconnect_cap=args.reconnect_cap,
        )
        for i in range(args.first, args.first + args.count)
    ]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bench.fleet", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--url", required=True, help="the hub's ws:// URL")
    p.add_argument("--seed", required=True, help="the fleet's token seed")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.01, help="seconds each action takes")
    p.add_argument("--jitter", type=float, default=0.0, help="up to this many seconds more, fixed per edge")
    p.add_argument("--parallel", type=int, default=200, help="connections being opened at once")
    p.add_argument("--reconnect-delay", type=float, default=0.5, help="the first retry's ceiling (as the agent's)")
    p.add_argument("--reconnect-cap", type=float, default=30.0, help="the backoff's cap (the agent's reconnectCap)")
    p.add_argument("--pings", action="store_true", help="edges keep sessions alive with websocket pings")
    p.add_argument("--cache", action="store_true", help="list cache.v1 and report when every edge has its cache")
    p.add_argument("--lean", action="store_true", help="bare edges (bench.lean_edge): pings only, no actions")
    args = p.parse_args(argv)
    soft, hard = raise_fd_limit()
    emit("started", nofile_soft=soft, nofile_hard=hard)
    configure_logging(level="error", fmt="console")
    anyio.run(serve, args, backend="trio")


if __name__ == "__main__":
    main()
