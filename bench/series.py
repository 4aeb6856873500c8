"""Each benchmark series' loop over its sizes and repeats, in the order :mod:`bench.run` runs them.

Every run is stored as it ends (:mod:`bench.store`), so that an interrupted series keeps the runs
before; a run that fails is noted (:mod:`bench.progress`) and the series goes on; the stored runs
of sizes not repeated now are kept.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import (
    cluster,
    codec,
    diagnosis_cost,
    edge_footprint,
    hub_cache,
    hub_capacity,
    hub_heap,
    hub_profile,
    job_cost,
    kubelet_upgrade,
    node_api_latency,
    progress,
    relay_load,
    store,
)


async def cluster_series(args: argparse.Namespace, results: dict[str, Any], failed: list[str]) -> None:
    """The series that need a control plane (``--cluster-dir``'s, else one started here), the cheapest first,
    on one fleet of Nodes registered for the largest of them."""
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
            fleet = max(fleet, max([1, *args.relay_sizes]) if "relay" in args.only else 0)
            fleet = max(fleet, 1 if "nodeapi" in args.only else 0)
            async with cluster.admin(cp) as kube:
                progress.log(f"registering {fleet} edge Nodes and token Secrets")
                took = await cluster.register_fleet(kube, count=fleet, sizes=sizes, seed=seed)
                progress.log(f"registered in {took:.0f}s")
            # Cheapest and most robust first: the 5,000-node job is last.
            if "nodeapi" in args.only:
                await _node_api(cp, seed, args, results, failed=failed)
            if "kubelet" in args.only:
                await _kubelet(cp, args, Path(tmp) / "kubelet", results, failed=failed)
            if "relay" in args.only:
                await _relay(cp, seed, args, Path(tmp), results, failed=failed)
            if "hub" in args.only:
                await _hub_capacity(cp, seed, args, Path(tmp), results, failed=failed)
            if "hubcache" in args.only:
                await _hub_cache(cp, seed, args, Path(tmp), results, failed=failed)
            if "heap" in args.only and args.heap_sessions:
                progress.log(f"hub heap profile: {args.heap_sessions} sessions")
                try:
                    heap = await hub_heap.heap_profile(cp, sessions=args.heap_sessions, seed=seed)
                except Exception as exc:  # the job series still runs
                    progress.note_failure(failed, f"hub heap profile, {args.heap_sessions} sessions", exc)
                else:
                    results.setdefault("hub_capacity", {"runs": [], "measured": store.now()})["heap"] = heap
                    store.save(results, args)
            if "diagnosis" in args.only:
                await _diagnosis_cost(cp, seed, args, results, failed=failed)
            if "job" in args.only:
                await _job_cost(cp, seed, args, results, failed=failed)


async def _node_api(
    cp: Any, seed: str, args: argparse.Namespace, results: dict[str, Any], *, failed: list[str]
) -> None:
    """The node API endpoint's series (issue 25): a fresh hub and agent per run."""
    progress.log(f"node API endpoint: {args.node_api_runs} runs of {args.node_api_rounds} rounds")
    try:
        results["node_api"] = await node_api_latency.series(
            cp, seed, runs=args.node_api_runs, rounds=args.node_api_rounds, cpu_requests=args.node_api_rounds
        )
    except Exception as exc:  # the other series still run
        progress.note_failure(failed, "node API endpoint", exc)
        return
    store.save(results, args)


async def _kubelet(
    cp: Any, args: argparse.Namespace, home: Path, results: dict[str, Any], *, failed: list[str]
) -> None:
    """The kubelet upgrade series (issue 26): one real node, one job after another, storing each run."""
    runs: list[dict[str, Any]] = []
    results["kubelet_upgrade"] = {
        "measured": store.now(), "runs": runs, "rate_per_s": kubelet_upgrade.RATE_PER_S,
        "request_limit_s": kubelet_upgrade.REQUEST_LIMIT_S,
    }  # fmt: skip

    def record(run: kubelet_upgrade.UpgradeRun) -> None:
        progress.log(
            f"  kubelet {run.target}: Ready {run.ready_s:.1f}s after the job's creation, Completed"
            f" {run.completed_s:.1f}s; {run.failed} of {run.answered + run.failed} requests failed"
        )
        runs.append({**asdict(run), "load": store.load_average(), "measured": store.now()})
        store.save(results, args)

    progress.log(f"kubelet upgrade: {args.kubelet_runs} jobs on one real node")
    try:
        await kubelet_upgrade.series(
            cp, home, runs=args.kubelet_runs, record=record,
            fail=lambda what, exc: progress.note_failure(failed, what, exc),
        )  # fmt: skip
    except Exception as exc:  # the other series still run
        progress.note_failure(failed, "kubelet upgrade", exc)


async def _relay(
    cp: Any, seed: str, args: argparse.Namespace, tmp: Path, results: dict[str, Any], *, failed: list[str]
) -> None:
    """N simulated nodes' kubelet traffic through one relaying hub, storing the results after every run."""
    previous = results.get("relay_load", {})
    runs = store.kept(previous, lambda r: r["nodes"] in args.relay_sizes and r["watches"] == args.relay_watches)
    results["relay_load"] = {
        "measured": store.now(), "runs": runs, "watches": args.relay_watches, "steady_s": relay_load.STEADY_S,
        **relay_load.SIZES,
    }  # fmt: skip
    for nodes in args.relay_sizes:
        for index in range(args.relay_repeats):
            progress.log(f"relay: {nodes} nodes' kubelet traffic, run {index + 1}/{args.relay_repeats}")
            try:
                run = await relay_load.run_size(
                    cp, seed, tmp / f"relay-{nodes}-{index}", nodes=nodes, watches=args.relay_watches
                )
            except Exception as exc:  # one failed run must not lose the others
                progress.note_failure(failed, f"relay: {nodes} nodes, run {index + 1}", exc)
                continue
            progress.log(f"  hub CPU {run.hub_cpu_share * 100:.1f}% of a core, {run.requests_per_s:.0f} requests/s")
            runs.append({**asdict(run), "load": store.load_average(), "measured": store.now()})
            store.save(results, args)


async def _job_cost(
    cp: Any, seed: str, args: argparse.Namespace, results: dict[str, Any], *, failed: list[str]
) -> None:
    """Run the job series, storing the results after every run."""
    previous = results.get("job_cost", {})
    runs = store.kept(previous, lambda r: r["nodes"] in args.job_sizes)
    entry: dict[str, Any] = {
        "measured": store.now(), "runs": runs, "window": args.window, "delay": args.delay, "off_limit": args.off_limit,
        "profiled": previous.get("profiled"),
    }  # fmt: skip
    if args.job_sizes or not previous:
        results["job_cost"] = entry
    else:  # only the profile was asked for: keep the stored runs
        entry = previous
    if args.profile_job:
        nodes = args.profile_job
        progress.log(f"job: {nodes} nodes under cProfile")
        path = store.RESULTS.parent / f"profile-job-{nodes}.txt"
        try:
            run = await job_cost.run_job(
                cp, nodes=nodes, window=args.window, seed=seed, delay=args.delay, limit_s=args.job_limit, index=99,
                profile=path,
            )  # fmt: skip
        except Exception as exc:  # the series still runs
            progress.note_failure(failed, f"job: {nodes} nodes under cProfile", exc)
        else:
            entry["profiled"] = {"nodes": nodes, "file": path.name, "seconds": run.seconds, "completed": run.completed}
            store.save(results, args)
    for nodes in args.job_sizes:
        for window in (args.window, 0.0):
            if window == 0.0 and nodes not in args.off_sizes:
                continue
            repeats = args.job_repeats if nodes <= args.cheap_job else args.big_job_repeats
            limit = args.off_limit if window == 0.0 and nodes > args.cheap_off else args.job_limit
            if window == 0.0 and nodes > args.cheap_off:
                repeats = 1
            for index in range(repeats):
                progress.log(f"job: {nodes} nodes, coalescing window {window}s, run {index + 1}/{repeats}")
                try:
                    run = await job_cost.run_job(
                        cp, nodes=nodes, window=window, seed=seed, delay=args.delay, limit_s=limit, index=index
                    )
                except Exception as exc:  # one failed run must not lose the others
                    progress.note_failure(failed, f"job: {nodes} nodes, window {window}s, run {index + 1}", exc)
                    continue
                progress.log(
                    f"  {'completed' if run.completed else 'NOT completed'} in {run.seconds:.1f}s, "
                    f"{run.hub_writes} hub writes, {run.hub_conflicts} conflicts, {run.object_bytes} bytes"
                )
                runs.append({**asdict(run), "load": store.load_average(), "measured": store.now()})
                store.save(results, args)


async def _diagnosis_cost(
    cp: Any, seed: str, args: argparse.Namespace, results: dict[str, Any], *, failed: list[str]
) -> None:
    """Run the diagnosis series, storing the results after every run; sizes not run keep their last results."""
    previous = results.get("diagnosis_cost", {})

    def rerun(r: dict[str, Any]) -> bool:
        same_edges = r.get("delay", args.delay) == args.delay and r.get("jitter", 0.0) in args.diagnosis_jitters
        return r["nodes"] in args.diagnosis_sizes and same_edges

    runs = store.kept(previous, rerun)
    entry: dict[str, Any] = {
        "measured": store.now(), "runs": runs, "window": args.window, "profiled": previous.get("profiled"),
    }  # fmt: skip
    results["diagnosis_cost"] = entry
    if args.profile_diagnosis:
        nodes = args.profile_diagnosis
        progress.log(f"diagnosis: {nodes} nodes under cProfile")
        path = store.RESULTS.parent / f"profile-diagnosis-{nodes}.txt"
        try:
            run = await diagnosis_cost.run_diagnosis(
                cp, nodes=nodes, window=args.window, seed=seed, delay=args.delay, limit_s=args.job_limit, index=99,
                profile=path,
            )  # fmt: skip
        except Exception as exc:  # the series still runs
            progress.note_failure(failed, f"diagnosis: {nodes} nodes under cProfile", exc)
        else:
            entry["profiled"] = {"nodes": nodes, "file": path.name, "seconds": run.seconds, "phase": run.phase}
            store.save(results, args)
    for nodes in args.diagnosis_sizes:
        for jitter, index in itertools.product(args.diagnosis_jitters, range(args.diagnosis_repeats)):
            what = f"diagnosis: {nodes} nodes, two stages, edges taking up to {jitter:g}s more"
            progress.log(f"{what}, run {index + 1}/{args.diagnosis_repeats}")
            try:
                run = await diagnosis_cost.run_diagnosis(
                    cp, nodes=nodes, window=args.window, seed=seed, delay=args.delay, limit_s=args.job_limit,
                    index=index, jitter=jitter,
                )  # fmt: skip
            except Exception as exc:  # one failed run must not lose the others
                progress.note_failure(failed, f"{what}, run {index + 1}", exc)
                continue
            progress.log(
                f"  {run.phase or 'NOT ended'} in {run.seconds:.1f}s, {run.hub_writes} hub and"
                f" {run.controller_writes} controller writes ({run.writes_per_node_stage:.2f} per node per stage),"
                f" {run.object_bytes} bytes"
            )
            runs.append({**diagnosis_cost.sample_dict(run), "load": store.load_average(), "measured": store.now()})
            store.save(results, args)


async def _hub_capacity(
    cp: Any, seed: str, args: argparse.Namespace, tmp: Path, results: dict[str, Any], *, failed: list[str]
) -> None:
    """Run the hub series, storing the results after every run."""
    previous = results.get("hub_capacity", {})
    runs = store.kept(previous, lambda r: r["sessions"] in args.hub_sizes)
    entry: dict[str, Any] = {"measured": store.now(), "runs": runs}
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
            progress.log(f"hub: {sessions} sessions, run {index + 1}/{repeats}")
            try:
                run = await hub_capacity.run_size(cp, sessions=sessions, seed=seed, state_dir=tmp, index=index)
            except Exception as exc:  # one failed run must not lose the others
                progress.note_failure(failed, f"hub: {sessions} sessions, run {index + 1}", exc)
                continue
            progress.log(f"  connected in {run.connect_s:.1f}s, {run.per_session_bytes / 1024:.1f} KiB/session")
            runs.append(
                {
                    **asdict(run),
                    "per_session_bytes": run.per_session_bytes,
                    "load": store.load_average(),
                    "measured": store.now(),
                }
            )
            store.save(results, args)


async def _hub_profile(
    cp: Any, seed: str, args: argparse.Namespace, tmp: Path, entry: dict[str, Any], *, failed: list[str]
) -> None:
    """One more hub run with py-spy sampling the hub during its bursts (not counted among the runs)."""
    sessions = args.profile_hub
    py_spy = hub_profile.find_py_spy(args.py_spy)
    if py_spy is None:
        progress.note_failure(failed, f"hub profile, {sessions} sessions", RuntimeError("no py-spy on PATH (--py-spy)"))
        return
    progress.log(f"hub: {sessions} sessions under py-spy")
    label = f"{sessions}"
    sample = hub_profile.sampler(py_spy, store.RESULTS.parent, label)
    try:
        await hub_capacity.run_size(cp, sessions=sessions, seed=seed, state_dir=tmp, index=99, sample=sample)
    except Exception as exc:
        progress.note_failure(failed, f"hub profile, {sessions} sessions", exc)
        return
    entry["profiled"] = {
        "sessions": sessions,
        "measured": store.now(),
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
        progress.log(f"hub cache: {args.cache_pods} Pods on each of {nodes} nodes")
        took = await hub_cache.ensure_objects(cp, kube, nodes=nodes, pods_per_node=args.cache_pods)
        progress.log(f"  created in {took:.0f}s")
    previous = results.get("hub_cache", {})
    # Runs of sizes not repeated now are kept, as the other series keep theirs, if they had as many Pods.
    same_pods = previous.get("pods_per_node") == args.cache_pods
    runs = store.kept(previous, lambda r: r["sessions"] in args.hub_cache_sizes or not same_pods)
    cluster_nodes = max(nodes, previous.get("cluster_nodes", 0) if runs else 0)
    results["hub_cache"] = {
        "measured": store.now(), "runs": runs, "pods_per_node": args.cache_pods, "cluster_nodes": cluster_nodes,
    }  # fmt: skip
    for sessions in args.hub_cache_sizes:
        for index in range(args.hub_cache_repeats):
            progress.log(f"hub cache: {sessions} sessions, run {index + 1}/{args.hub_cache_repeats}")
            try:
                run = await hub_cache.run_size(
                    cp, sessions=sessions, pods_per_node=args.cache_pods, seed=seed, state_dir=tmp, index=index
                )
            except Exception as exc:  # one failed run must not lose the others
                progress.note_failure(failed, f"hub cache: {sessions} sessions, run {index + 1}", exc)
                continue
            progress.log(f"  cached in {run.cached_s:.1f}s, {run.per_session_bytes / 1024:.1f} KiB/session")
            runs.append({**asdict(run), "per_session_bytes": run.per_session_bytes, "load": store.load_average()})
            store.save(results, args)


def codec_series(args: argparse.Namespace) -> dict[str, Any]:
    """The codec series (no cluster): its rates, and how much of a report's decode a new route is."""
    progress.log("codec")
    rows = codec.run(iterations=args.codec_iterations, repeats=args.codec_repeats)
    shares = [codec.route_share(iterations=args.codec_iterations) for _ in range(args.codec_repeats)]
    return {
        "measured": store.now(),
        "rows": [asdict(r) for r in rows],
        "route_share": statistics.median(shares),
        "iterations": args.codec_iterations,
        "repeats": args.codec_repeats,
    }


async def edge_footprint_series(args: argparse.Namespace) -> dict[str, Any]:
    """The edge footprint series (no cluster): fresh agents, the launcher, the imports, the cache runs."""
    progress.log(f"edge footprint: {args.edge_runs} agents")
    settle_s = 5.0
    runs = await edge_footprint.run(runs=args.edge_runs, settle_s=settle_s, layer_mib=args.edge_layer_mib)
    return {
        "measured": store.now(),
        "runs": [asdict(r) for r in runs],
        "imports": [asdict(s) for s in edge_footprint.import_costs()],
        "launcher": asdict(await edge_footprint.launcher_run(settle_s=settle_s)),
        # Alternated, so that a change in the machine's load falls on both alike.
        "cache": [
            asdict(await edge_footprint.cache_run(local_api=api, metrics=metrics, settle_s=settle_s))
            for _ in range(args.edge_runs)
            for api, metrics in ((False, False), (True, False), (False, True))
        ],
        "settle_s": settle_s,
        "layer_mib": args.edge_layer_mib,
        "load": store.load_average(),
    }
