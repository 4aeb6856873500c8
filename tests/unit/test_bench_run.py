"""The benchmark runner: a failed run is reported and the series goes on."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench import diagnosis_cost, job_cost, run
from bench.waits import Stalled


async def _stalls(*args: Any, **kwargs: Any) -> Any:
    raise Stalled("waited 60 s for the fleet to say 'connected'")


@pytest.mark.parametrize(
    ("series", "module", "runner", "option"),
    [
        (run._job_cost, job_cost, "run_job", "profile_job"),
        (run._diagnosis_cost, diagnosis_cost, "run_diagnosis", "profile_diagnosis"),
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
