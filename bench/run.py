"""``just bench``: run the benchmarks and write ``docs/benchmarks.md`` (plus PNGs under ``docs/bench/``).

    python -m bench.run [--only codec|job|diagnosis|hub|hubcache ...] [--job-sizes 100,1000,5000] [--hub-sizes ...]

Raw results go to ``docs/bench/results.json``; a partial run (``--only``) keeps the other
benchmarks' last results, and the report says when each was measured. Without ``--cluster-dir``
the run starts its own kube-apiserver + etcd on loopback and stops it at the end, also when stopped
with Ctrl-C or SIGTERM. Every wait has a deadline (``bench/waits.py``); a run that misses one is
reported as FAILED with what it waited for, the others go on, and the exit status is then 1.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from bench import cluster, machine, progress, series, store
from bench.fleet import raise_fd_limit
from bench.report import page
from roles.common.logs import configure_logging

SERIES = ("codec", "edge", "job", "diagnosis", "hub", "hubcache", "heap", "nodeapi", "kubelet", "relay")


def _sizes(text: str) -> list[int]:
    return [int(s.replace("_", "")) for s in text.split(",") if s.strip()]


async def _terminable(fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Run ``fn(*args)``; SIGTERM cancels it, so that it stops what it started as after Ctrl-C, then exits 143."""
    terminated = False
    async with anyio.create_task_group() as tg:

        async def on_sigterm(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            nonlocal terminated
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                task_status.started()
                async for _ in signals:
                    terminated = True
                    progress.log("SIGTERM: stopping what this run started")
                    tg.cancel_scope.cancel()

        await tg.start(on_sigterm)
        await fn(*args)
        tg.cancel_scope.cancel()
    if terminated:
        raise SystemExit(128 + signal.SIGTERM)


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.run``."""
    p = argparse.ArgumentParser(prog="bench.run", description="Run the benchmarks and write docs/benchmarks.md.")
    p.add_argument(
        "--only",
        action="append",
        choices=SERIES,
        help="run only these (repeatable)",
    )
    p.add_argument("--job-sizes", type=_sizes, default=[100, 1000, 5000], help="nodes per job, comma-separated")
    p.add_argument("--diagnosis-sizes", type=_sizes, default=[1000], help="nodes per two-stage Diagnosis")
    p.add_argument("--diagnosis-repeats", type=int, default=3, help="runs per Diagnosis size and jitter")
    p.add_argument(
        "--diagnosis-jitters",
        type=lambda text: [float(s) for s in text.split(",") if s.strip()],
        default=[0.0, 5.0],
        help="seconds the edges take more than --delay, at most (one series each), comma-separated",
    )
    p.add_argument(
        "--profile-diagnosis", type=int, default=1000, help="nodes of one extra Diagnosis run under cProfile (0: none)"
    )
    p.add_argument("--off-sizes", type=_sizes, default=[100, 1000], help="sizes also run with coalescing off")
    p.add_argument("--hub-sizes", type=_sizes, default=[1000, 5000, 10000], help="sessions, comma-separated")
    p.add_argument("--hub-cache-sizes", type=_sizes, default=[1000, 10000], help="cache sessions, comma-separated")
    p.add_argument("--hub-cache-repeats", type=int, default=1, help="runs per cache size")
    p.add_argument("--cache-pods", type=int, default=10, help="Pods per node in the cache series")
    p.add_argument("--window", type=float, default=0.2, help="the coalescing window when on (seconds)")
    p.add_argument("--delay", type=float, default=0.01, help="seconds each edge action takes")
    p.add_argument("--job-repeats", type=int, default=3, help="runs per job size up to --cheap-job nodes")
    p.add_argument("--big-job-repeats", type=int, default=1, help="runs per larger job size")
    p.add_argument("--cheap-job", type=int, default=1000)
    p.add_argument("--cheap-off", type=int, default=100, help="larger coalescing-off jobs run once, capped")
    p.add_argument("--job-limit", type=float, default=1800, help="seconds a job may take before it is cut off")
    p.add_argument("--off-limit", type=float, default=300, help="cap for the larger coalescing-off jobs")
    p.add_argument("--profile-job", type=int, default=1000, help="nodes of one extra job run under cProfile (0: none)")
    p.add_argument("--hub-repeats", type=int, default=3, help="runs per hub size up to 1,000 sessions")
    p.add_argument("--big-hub-repeats", type=int, default=2, help="runs per larger hub size")
    p.add_argument(
        "--profile-hub", type=int, default=0, help="sessions of one extra hub run sampled by py-spy (0: none)"
    )
    p.add_argument("--py-spy", help="the py-spy executable for --profile-hub (default: the one on PATH)")
    p.add_argument("--heap-sessions", type=int, default=2000, help="sessions of the tracemalloc run (0: none)")
    p.add_argument("--codec-iterations", type=int, default=50_000)
    p.add_argument("--codec-repeats", type=int, default=7)
    p.add_argument("--edge-runs", type=int, default=3, help="fresh agents measured by the edge footprint")
    p.add_argument("--edge-layer-mib", type=int, default=32, help="size of the image layer the agent pulls")
    p.add_argument("--node-api-runs", type=int, default=3, help="fresh hub and agent pairs of the node API series")
    p.add_argument("--node-api-rounds", type=int, default=1000, help="requests per row and way in each of them")
    p.add_argument("--kubelet-runs", type=int, default=6, help="kubelet upgrades of the kubelet series (alternating)")
    # 10,000 needs a hub allowed more file descriptors than this machine's hard limit (20,000): one per tunnel.
    p.add_argument("--relay-sizes", type=_sizes, default=[1000], help="simulated nodes through one hub")
    p.add_argument("--relay-repeats", type=int, default=2, help="runs per relay size")
    p.add_argument("--relay-watches", type=int, default=6, help="watch tunnels each simulated node holds open")
    p.add_argument("--cluster-dir", type=Path, help="use the control plane running in this state directory")
    p.add_argument("--out", type=Path, default=cluster.REPO / "docs" / "benchmarks.md")
    p.add_argument("--render", action="store_true", help="only rewrite the report from the stored results")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.render:
        page.write(msgspec.json.decode(store.RESULTS.read_bytes()), out=args.out, images=store.RESULTS.parent)
        return
    args.only = args.only or list(SERIES)
    raise_fd_limit()
    configure_logging(level="error", fmt="console")
    results: dict[str, Any] = msgspec.json.decode(store.RESULTS.read_bytes()) if store.RESULTS.exists() else {}
    results["machine"] = machine.describe()
    failed: list[str] = []
    if "codec" in args.only:
        results["codec"] = series.codec_series(args)
        store.save(results, args)
    if "edge" in args.only:
        anyio.run(_terminable, _edge_footprint_into, args, results, backend="trio")
    if {"job", "diagnosis", "hub", "hubcache", "heap", "nodeapi", "kubelet", "relay"} & set(args.only):
        anyio.run(_terminable, series.cluster_series, args, results, failed, backend="trio")
    if failed:
        progress.log(f"{len(failed)} run(s) FAILED and are missing from the report:")
        for line in failed:
            progress.log(f"  {line}")
        raise SystemExit(1)


async def _edge_footprint_into(args: argparse.Namespace, results: dict[str, Any]) -> None:
    results["edge_footprint"] = await series.edge_footprint_series(args)
    store.save(results, args)


if __name__ == "__main__":
    main()
