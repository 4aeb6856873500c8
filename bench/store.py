"""The stored results, ``docs/bench/results.json``: written after every run (the report rewritten with
them), each run stamped with when it was measured and the load it ended at, and the runs of a series
that a partial run does not repeat kept."""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Callable
from typing import Any

import msgspec

from bench import cluster, progress
from bench.report import page

RESULTS = cluster.REPO / "docs" / "bench" / "results.json"


def now() -> str:
    """When a run was measured, to the minute (UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def load_average() -> float:
    """The 1-minute load average as a run ends (2 cores: above 2 means others were competing)."""
    return os.getloadavg()[0]


def kept(previous: dict[str, Any], rerun: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """The stored runs of a series that this run does not repeat, stamped with when they were measured."""
    return [{"measured": previous.get("measured", ""), **r} for r in previous.get("runs", []) if not rerun(r)]


def save(results: dict[str, Any], args: argparse.Namespace) -> None:
    """Store the results and rewrite the report (after each benchmark, so an interrupted run keeps some)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(msgspec.json.format(msgspec.json.encode(results)) + b"\n")
    page.write(results, out=args.out, images=RESULTS.parent)
    progress.log(f"wrote {args.out}")
