"""The report's plots (matplotlib on the Agg backend); without matplotlib the report has tables only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report.cells import KIB, median


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None: without it the tables are written alone."""
    try:
        import matplotlib  # noqa: PLC0415 - optional

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - after choosing the backend
    except ImportError:
        return None
    return plt


def _finish(plt: Any, fig: Any, title: str, path: Path) -> bool:
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def job(runs: list[dict[str, Any]], path: Path) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for window, label in ((True, "coalescing on"), (False, "coalescing off")):
        done = [r for r in runs if bool(r["window"]) is window and r["completed"]]
        sizes = sorted({r["nodes"] for r in done})
        if sizes:
            times = [median(r["seconds"] for r in done if r["nodes"] == n) for n in sizes]
            left.plot(sizes, times, "o-", label=label)
        # Writes per finished node: a run cut off early still says what each node cost.
        some = [r for r in runs if bool(r["window"]) is window and r["finished_nodes"]]
        sizes = sorted({r["nodes"] for r in some})
        per_node = [median(r["hub_writes"] / r["finished_nodes"] for r in some if r["nodes"] == n) for n in sizes]
        right.plot(sizes, per_node, "o-", label=label)
    left.set(xscale="log", yscale="log", xlabel="nodes in the job", ylabel="seconds to Completed")
    right.set(xscale="log", xlabel="nodes in the job", ylabel="hub status writes per finished node")
    right.axhline(0.2, color="grey", linestyle=":", label="target (on)")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    return _finish(plt, fig, "Benchmark 1: one ImagePrePullJob, concurrency 100", path)


def hub(runs: list[dict[str, Any]], path: Path) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    sizes = sorted({r["sessions"] for r in runs})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(sizes, [median(r["per_session_bytes"] / KIB for r in runs if r["sessions"] == n) for n in sizes], "o-")
    left.axhline(50, color="grey", linestyle=":", label="target")
    left.set(xlabel="sessions", ylabel="hub RSS per session (KiB)", ylim=(0, None))
    for key, label in (("connect_s", "welcomed"), ("marked_s", "Nodes marked")):
        right.plot(sizes, [median(r[key] for r in runs if r["sessions"] == n) for n in sizes], "o-", label=label)
    right.set(xlabel="sessions", ylabel="seconds to connect all")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend()
    return _finish(plt, fig, "Benchmark 2: sessions held by one hub process", path)


def codec(rows: list[dict[str, Any]], path: Path) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    pairs = [r for r in rows if r["json_per_s"]]
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(len(pairs))
    ax.bar([x - 0.2 for x in xs], [r["msgspec_per_s"] for r in pairs], 0.4, label="msgspec (nodetask.messages)")
    ax.bar([x + 0.2 for x in xs], [r["json_per_s"] for r in pairs], 0.4, label="stdlib json + checks")
    ax.set_xticks(list(xs), [r["operation"].replace(" (", "\n(") for r in pairs], fontsize=7)
    ax.set(yscale="log", ylabel="messages per second")
    ax.legend()
    ax.grid(True, axis="y", which="both", alpha=0.3)
    return _finish(plt, fig, "Benchmark 3: wire codec", path)
