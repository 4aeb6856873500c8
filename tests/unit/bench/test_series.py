"""The benchmark runner: a failed run is reported and the series goes on; runs not repeated are kept."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bench import cluster, diagnosis_cost, hub_cache, job_cost, series, store
from bench.waits import Stalled


async def _stalls(*args: Any, **kwargs: Any) -> Any:
    raise Stalled("waited 60 s for the fleet to say 'connected'")


@pytest.mark.parametrize(
    ("series", "module", "runner", "option"),
    [
        (series._job_cost, job_cost, "run_job", "profile_job"),
        (series._diagnosis_cost, diagnosis_cost, "run_diagnosis", "profile_diagnosis"),
    ],
)
async def test_a_profiled_run_that_stalls_is_reported_failed_and_the_series_goes_on(
    monkeypatch: pytest.MonkeyPatch, series: Any, module: Any, runner: str, option: str
) -> None:
    """The extra run under cProfile missing a deadline is listed among the failed runs, with what it waited
    for, instead of ending the whole benchmark; the profile stored before is kept."""
    monkeypatch.setattr(module, runner, _stalls)
    args = argparse.Namespace(
        job_sizes=[], diagnosis_sizes=[], diagnosis_jitters=[0.0], window=0.2, delay=0.01, off_limit=300,
        job_limit=60, **{"profile_job": 0, "profile_diagnosis": 0, option: 10},
    )  # fmt: skip
    stored = {"nodes": 1000, "file": "profile-1000.txt", "seconds": 1.0}
    results: dict[str, Any] = {"job_cost": {"runs": [], "profiled": stored}, "diagnosis_cost": {"profiled": stored}}
    failed: list[str] = []

    await series(None, "seed", args, results, failed=failed)

    (line,) = failed
    assert line.endswith("nodes under cProfile: waited 60 s for the fleet to say 'connected'")
    assert results[series.__name__.removeprefix("_")]["profiled"] == stored


async def test_a_hub_cache_run_of_some_sizes_keeps_the_stored_runs_of_the_others(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Re-running the cache series at 1,000 sessions replaces the stored 1,000 run and keeps the 10,000 one,
    unless the stored runs had another number of Pods per node."""

    @contextlib.asynccontextmanager
    async def admin(cp: Any) -> AsyncIterator[None]:
        yield None

    async def ensure_objects(*args: Any, **kwargs: Any) -> float:
        return 0.0

    async def run_size(*, sessions: int, pods_per_node: int, **kwargs: Any) -> hub_cache.CacheRun:
        return hub_cache.CacheRun(sessions=sessions, pods_per_node=pods_per_node, baseline_rss=0, nofile=(1, 1), rss=7)

    monkeypatch.setattr(cluster, "admin", admin)
    monkeypatch.setattr(hub_cache, "ensure_objects", ensure_objects)
    monkeypatch.setattr(hub_cache, "run_size", lambda cp, **kw: run_size(**kw))
    monkeypatch.setattr(store, "save", lambda results, args: None)
    stored = {
        "measured": "earlier",
        "pods_per_node": 10,
        "cluster_nodes": 10000,
        "runs": [{"sessions": 1000, "rss": 1}, {"sessions": 10000, "rss": 2}],
    }
    args = argparse.Namespace(hub_cache_sizes=[1000], hub_cache_repeats=1, cache_pods=10)

    results: dict[str, Any] = {"hub_cache": dict(stored)}
    await series._hub_cache(None, "seed", args, tmp_path, results, failed=[])
    entry = results["hub_cache"]
    assert sorted((r["sessions"], r["rss"]) for r in entry["runs"]) == [(1000, 7), (10000, 2)]
    assert entry["cluster_nodes"] == 10000

    results = {"hub_cache": {**stored, "pods_per_node": 20}}
    await series._hub_cache(None, "seed", args, tmp_path, results, failed=[])
    assert [(r["sessions"], r["rss"]) for r in results["hub_cache"]["runs"]] == [(1000, 7)]
    assert results["hub_cache"]["cluster_nodes"] == 1000
