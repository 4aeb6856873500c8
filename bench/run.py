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
import datetime
import itertools
import os
import signal
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from bench import (
    cluster,
    codec,
    diagnosis_cost,
    edge_footprint,
    hub_cache,
    hub_capacity,
    hub_profile,
    job_cost,
    machine,
)
from bench.fleet import raise_fd_limit
from bench.report import page as report
from bench.waits import Stalled
from roles.common.logs import configure_logging

RESULTS = cluster.REPO / "docs" / "bench" / "results.json"


def _sizes(text: str) -> list[int]:
    return [int(s.replace("_", "")) for s in text.split(",") if s.strip()]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _load() -> float:
    """The 1-minute load average as a run ends (2 cores: above 2 means others were competing)."""
    return os.getloadavg()[0]


def _log(message: str) -> None:
    sys.stderr.write(f"[bench] {message}\n")
    sys.stderr.flush()


def _failed(failed: list[str], what: str, exc: Exception) -> None:
    """Note a failed run: logged at once, listed again at the end, and the exit status says so."""
    reason = "; ".join(str(e) if isinstance(e, Stalled) else repr(e) for e in _leaves(exc))
    failed.append(f"{what}: {reason}")
    _log(f"  FAILED: {reason}")


def _kept(previous: dict[str, Any], rerun: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """The stored runs of a series that this run does not repeat, stamped with when they were measured."""
    return [{"measured": previous.get("measured", ""), **r} for r in previous.get("runs", []) if not rerun(r)]


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside the groups that task groups wrap them in."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


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
                    _log("SIGTERM: stopping what this run started")
                    tg.cancel_scope.cancel()

        await tg.start(on_sigterm)
        await fn(*args)
        tg.cancel_scope.cancel()
    if terminated:
        raise SystemExit(128 + signal.SIGTERM)


async def _cluster_benchmarks(args: argparse.Namespace, results: dict[str, Any], failed: list[str]) -> None:
    profiled = {args.profile_job, args.profile_diagnosis}
    sizes = sorted({*args.job_sizes, *args.diagnosis_sizes, *args.hub_sizes, *profiled, args.heap_sessions} - {0})
    with tempfile.TemporaryDirectory(prefix="nodetaskd-bench-") as tmp:
        async with cluster.control_plane(args.cluster_dir, Path(tmp) / "cp") as cp:
            seed = cluster.fleet_seed(cp)
            fleet = max([*args.job_sizes, args.profile_job] if "job" in args.only else [0])
            fleet = max(fleet, max([*args.hub_sizes, args.profile_hub]) if "hub" in args.only else 0)
            fleet = max(fleet, args.heap_sessions if "heap" in args.only else 0)
            if "diagnosis" in args.only:
                fleet = max(fleet, *args.diagnosis_sizes, args.profile_diagnosis)
            fleet = max(fleet, max(args.hub_cache_sizes) if "hubcache" in args.only else 0)
            async with cluster.admin(cp) as kube:
                _log(f"registering {fleet} edge Nodes and token Secrets")
                took = await cluster.register_fleet(kube, count=fleet, sizes=sizes, seed=seed)
                _log(f"registered in {took:.0f}s")
            # Cheapest and most robust first: the 5,000-node job is last.
            if "hub" in args.only:
                await _hub_capacity(cp, seed, args, Path(tmp), results, failed=failed)
            if "hubcache" in args.only:
                await _hub_cache(cp, seed, args, Path(tmp), results, failed=failed)
            if "heap" in args.only and args.heap_sessions:
                _log(f"hub heap profile: {args.heap_sessions} sessions")
                try:
                    heap = await hub_capacity.heap_profile(cp, sessions=args.heap_sessions, seed=seed)
                except Exception as exc:  # the job series still runs
                    _failed(failed, f"hub heap profile, {args.heap_sessions} sessions", exc)
                else:
                    results.setdefault("hub_capacity", {"runs": [], "measured": _now()})["heap"] = heap
                    _save(results, args)
            if "diagnosis" in args.only:
                await _diagnosis_cost(cp, seed, args, results, failed=failed)
            if "job" in args.only:
                await _job_cost(cp, seed, args, results, failed=failed)


async def _job_cost(
    cp: Any, seed: str, args: argparse.Namespace, results: dict[str, Any], *, failed: list[str]
) -> None:
    """Run the job series, storing the results after every run."""
    previous = results.get("job_cost", {})
    runs = _kept(previous, lambda r: r["nodes"] in args.job_sizes)
    entry: dict[str, Any] = {
        "measured": _now(), "runs": runs, "window": args.window, "delay": args.delay, "off_limit": args.off_limit,
        "profiled": previous.get("profiled"),
    }  # fmt: skip
    if args.job_sizes or not previous:
        results["job_cost"] = entry
    else:  # only the profile was asked for: keep the stored runs
        entry = previous
    if args.profile_job:
        nodes = args.profile_job
        _log(f"job: {nodes} nodes under cProfile")
        path = RESULTS.parent / f"profile-job-{nodes}.txt"
        try:
            run = await job_cost.run_job(
                cp, nodes=nodes, window=args.window, seed=seed, delay=args.delay, limit_s=args.job_limit, index=99,
                profile=path,
            )  # fmt: skip
        except Exception as exc:  # the series still runs
            _failed(failed, f"job: {nodes} nodes under cProfile", exc)
        else:
            entry["profiled"] = {"nodes": nodes, "file": path.name, "seconds": run.seconds, "completed": run.completed}
            _save(results, args)
    for nodes in args.job_sizes:
        for window in (args.window, 0.0):
            if window == 0.0 and nodes not in args.off_sizes:
                continue
            repeats = args.job_repeats if nodes <= args.cheap_job else args.big_job_repeats
            limit = args.off_limit if window == 0.0 and nodes > args.cheap_off else args.job_limit
            if window == 0.0 and nodes > args.cheap_off:
                repeats = 1
            for index in range(repeats):
                _log(f"job: {nodes} nodes, coalescing window {window}s, run {index + 1}/{repeats}")
                try:
                    run = await job_cost.run_job(
                        cp, nodes=nodes, window=window, seed=seed, delay=args.delay, limit_s=limit, index=index
                    )
                except Exception as exc:  # one failed run must not lose the others
                    _failed(failed, f"job: {nodes} nodes, window {window}s, run {index + 1}", exc)
                    continue
                _log(
                    f"  {'completed' if run.completed else 'NOT completed'} in {run.seconds:.1f}s, "
                    f"{run.hub_writes} hub writes, {run.hub_conflicts} conflicts, {run.object_bytes} bytes"
                )
                runs.append({**asdict(run), "load": _load(), "measured": _now()})
                _save(results, args)


async def _diagnosis_cost(
    cp: Any, seed: str, args: argparse.Namespace, results: dict[str, Any], *, failed: list[str]
) -> None:
    """Run the diagnosis series, storing the results after every run; sizes not run keep their last results."""
    previous = results.get("diagnosis_cost", {})

    def rerun(r: dict[str, Any]) -> bool:
        same_edges = r.get("delay", args.delay) == args.delay and r.get("jitter", 0.0) in args.diagnosis_jitters
        return r["nodes"] in args.diagnosis_sizes and same_edges

    runs = _kept(previous, rerun)
    entry: dict[str, Any] = {
        "measured": _now(), "runs": runs, "window": args.window, "profiled": previous.get("profiled"),
    }  # fmt: skip
    results["diagnosis_cost"] = entry
    if args.profile_diagnosis:
        nodes = args.profile_diagnosis
        _log(f"diagnosis: {nodes} nodes under cProfile")
        path = RESULTS.parent / f"profile-diagnosis-{nodes}.txt"
        try:
            run = await diagnosis_cost.run_diagnosis(
                cp, nodes=nodes, window=args.window, seed=seed, delay=args.delay, limit_s=args.job_limit, index=99,
                profile=path,
            )  # fmt: skip
        except Exception as exc:  # the series still runs
            _failed(failed, f"diagnosis: {nodes} nodes under cProfile", exc)
        else:
            entry["profiled"] = {"nodes": nodes, "file": path.name, "seconds": run.seconds, "phase": run.phase}
            _save(results, args)
    for nodes in args.diagnosis_sizes:
        for jitter, index in itertools.product(args.diagnosis_jitters, range(args.diagnosis_repeats)):
            what = f"diagnosis: {nodes} nodes, two stages, edges taking up to {jitter:g}s more"
            _log(f"{what}, run {index + 1}/{args.diagnosis_repeats}")
            try:
                run = await diagnosis_cost.run_diagnosis(
                    cp, nodes=nodes, window=args.window, seed=seed, delay=args.delay, limit_s=args.job_limit,
                    index=index, jitter=jitter,
                )  # fmt: skip
            except Exception as exc:  # one failed run must not lose the others
                _failed(failed, f"{what}, run {index + 1}", exc)
                continue
            _log(
                f"  {run.phase or 'NOT ended'} in {run.seconds:.1f}s, {run.hub_writes} hub and"
                f" {run.controller_writes} controller writes ({run.writes_per_node_stage:.2f} per node per stage),"
                f" {run.object_bytes} bytes"
            )
            runs.append({**diagnosis_cost.sample_dict(run), "load": _load(), "measured": _now()})
            _save(results, args)


async def _hub_capacity(
    cp: Any, seed: str, args: argparse.Namespace, tmp: Path, results: dict[str, Any], *, failed: list[str]
) -> None:
    """Run the hub series, storing the results after every run."""
    previous = results.get("hub_capacity", {})
    runs = _kept(previous, lambda r: r["sessions"] in args.hub_sizes)
    entry: dict[str, Any] = {"measured": _now(), "runs": runs}
    # The heap profile is a series of its own (--only heap): a hub-only run keeps the last one.
    for kept in ("heap", "profiled"):
        if previous.get(kept):
            entry[kept] = previous[kept]
    results["hub_capacity"] = entry
    if args.profile_hub:
        await _hub_profile(cp, seed, args, tmp, entry, failed=failed)
    for sessions in args.hub_sizes:
        repeats = args.hub_repeats if sessions <= 1000 else args.big_hub_repeats
        for index in range(repeats):
            _log(f"hub: {sessions} sessions, run {index + 1}/{repeats}")
            try:
                run = await hub_capacity.run_size(cp, sessions=sessions, seed=seed, state_dir=tmp, index=index)
            except Exception as exc:  # one failed run must not lose the others
                _failed(failed, f"hub: {sessions} sessions, run {index + 1}", exc)
                continue
            _log(f"  connected in {run.connect_s:.1f}s, {run.per_session_bytes / 1024:.1f} KiB/session")
            runs.append(
                {**asdict(run), "per_session_bytes": run.per_session_bytes, "load": _load(), "measured": _now()}
            )
            _save(results, args)


async def _hub_profile(
    cp: Any, seed: str, args: argparse.Namespace, tmp: Path, entry: dict[str, Any], *, failed: list[str]
) -> None:
    """One more hub run with py-spy sampling the hub during its bursts (not counted among the runs)."""
    sessions = args.profile_hub
    py_spy = hub_profile.find_py_spy(args.py_spy)
    if py_spy is None:
        _failed(failed, f"hub profile, {sessions} sessions", RuntimeError("no py-spy on PATH (--py-spy)"))
        return
    _log(f"hub: {sessions} sessions under py-spy")
    label = f"{sessions}"
    sample = hub_profile.sampler(py_spy, RESULTS.parent, label)
    try:
        await hub_capacity.run_size(cp, sessions=sessions, seed=seed, state_dir=tmp, index=99, sample=sample)
    except Exception as exc:
        _failed(failed, f"hub profile, {sessions} sessions", exc)
        return
    entry["profiled"] = {
        "sessions": sessions,
        "measured": _now(),
        "files": [
            f"profile-hub-{label}-{phase}.txt" for phase in ("connect", "heartbeat", "ping", "report", "reconnect")
        ],
    }


async def _hub_cache(
    cp: Any, seed: str, args: argparse.Namespace, tmp: Path, results: dict[str, Any], *, failed: list[str]
) -> None:
    """Run the hub series with cache streams, storing the results after every run."""
    nodes = max(args.hub_cache_sizes)
    async with cluster.admin(cp) as kube:
        _log(f"hub cache: {args.cache_pods} Pods on each of {nodes} nodes")
        took = await hub_cache.ensure_objects(cp, kube, nodes=nodes, pods_per_node=args.cache_pods)
        _log(f"  created in {took:.0f}s")
    previous = results.get("hub_cache", {})
    # Runs of sizes not repeated now are kept, as the other series keep theirs, if they had as many Pods.
    same_pods = previous.get("pods_per_node") == args.cache_pods
    runs = _kept(previous, lambda r: r["sessions"] in args.hub_cache_sizes or not same_pods)
    cluster_nodes = max(nodes, previous.get("cluster_nodes", 0) if runs else 0)
    results["hub_cache"] = {
        "measured": _now(), "runs": runs, "pods_per_node": args.cache_pods, "cluster_nodes": cluster_nodes,
    }  # fmt: skip
    for sessions in args.hub_cache_sizes:
        for index in range(args.hub_cache_repeats):
            _log(f"hub cache: {sessions} sessions, run {index + 1}/{args.hub_cache_repeats}")
            try:
                run = await hub_cache.run_size(
                    cp, sessions=sessions, pods_per_node=args.cache_pods, seed=seed, state_dir=tmp, index=index
                )
            except Exception as exc:  # one failed run must not lose the others
                _failed(failed, f"hub cache: {sessions} sessions, run {index + 1}", exc)
                continue
            _log(f"  cached in {run.cached_s:.1f}s, {run.per_session_bytes / 1024:.1f} KiB/session")
            runs.append({**asdict(run), "per_session_bytes": run.per_session_bytes, "load": _load()})
            _save(results, args)


def _codec(args: argparse.Namespace) -> dict[str, Any]:
    _log("codec")
    rows = codec.run(iterations=args.codec_iterations, repeats=args.codec_repeats)
    shares = [codec.route_share(iterations=args.codec_iterations) for _ in range(args.codec_repeats)]
    return {
        "measured": _now(),
        "rows": [asdict(r) for r in rows],
        "route_share": statistics.median(shares),
        "iterations": args.codec_iterations,
        "repeats": args.codec_repeats,
    }


async def _edge_footprint(args: argparse.Namespace) -> dict[str, Any]:
    _log(f"edge footprint: {args.edge_runs} agents")
    settle_s = 5.0
    runs = await edge_footprint.run(runs=args.edge_runs, settle_s=settle_s, layer_mib=args.edge_layer_mib)
    return {
        "measured": _now(),
        "runs": [asdict(r) for r in runs],
        "imports": [asdict(s) for s in edge_footprint.import_costs()],
        "launcher": asdict(await edge_footprint.launcher_run(settle_s=settle_s)),
        # Alternated, so that a change in the machine's load falls on both alike.
        "cache": [
            asdict(await edge_footprint.cache_run(local_api=on, settle_s=settle_s))
            for _ in range(args.edge_runs)
            for on in (False, True)
        ],
        "settle_s": settle_s,
        "layer_mib": args.edge_layer_mib,
        "load": _load(),
    }


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.run``."""
    p = argparse.ArgumentParser(prog="bench.run", description="Run the benchmarks and write docs/benchmarks.md.")
    p.add_argument(
        "--only",
        action="append",
        choices=("codec", "edge", "job", "diagnosis", "hub", "hubcache", "heap"),
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
    p.add_argument("--cluster-dir", type=Path, help="use the control plane running in this state directory")
    p.add_argument("--out", type=Path, default=cluster.REPO / "docs" / "benchmarks.md")
    p.add_argument("--render", action="store_true", help="only rewrite the report from the stored results")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.render:
        report.write(msgspec.json.decode(RESULTS.read_bytes()), out=args.out, images=RESULTS.parent)
        return
    args.only = args.only or ["codec", "edge", "job", "diagnosis", "hub", "hubcache", "heap"]
    raise_fd_limit()
    configure_logging(level="error", fmt="console")
    results: dict[str, Any] = msgspec.json.decode(RESULTS.read_bytes()) if RESULTS.exists() else {}
    results["machine"] = machine.describe()
    failed: list[str] = []
    if "codec" in args.only:
        results["codec"] = _codec(args)
        _save(results, args)
    if "edge" in args.only:
        anyio.run(_terminable, _edge_footprint_into, args, results, backend="trio")
    if {"job", "diagnosis", "hub", "hubcache", "heap"} & set(args.only):
        anyio.run(_terminable, _cluster_benchmarks, args, results, failed, backend="trio")
    if failed:
        _log(f"{len(failed)} run(s) FAILED and are missing from the report:")
        for line in failed:
            _log(f"  {line}")
        raise SystemExit(1)


async def _edge_footprint_into(args: argparse.Namespace, results: dict[str, Any]) -> None:
    results["edge_footprint"] = await _edge_footprint(args)
    _save(results, args)


def _save(results: dict[str, Any], args: argparse.Namespace) -> None:
    """Store the results and rewrite the report (after each benchmark, so an interrupted run keeps some)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(msgspec.json.format(msgspec.json.encode(results)) + b"\n")
    report.write(results, out=args.out, images=RESULTS.parent)
    _log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
