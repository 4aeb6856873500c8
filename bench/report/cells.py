"""What every section of the report writes its figures with: medians, number formats, Markdown tables."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

MIB = 1 << 20
KIB = 1 << 10


def median(values: Iterable[float]) -> float:
    """The median of ``values``; nan when there are none."""
    vals = list(values)
    return statistics.median(vals) if vals else float("nan")


def whole(x: float) -> str:
    """``x`` as a whole number with thousands separators."""
    return f"{x:,.0f}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def median_of(runs: Iterable[dict[str, Any]], key: str) -> float:
    """The median of ``key`` over ``runs``."""
    return median(float(r[key]) for r in runs)


def load_at_end(runs: Iterable[dict[str, Any]]) -> str:
    """The median load average the runs ended at (runs from before it was recorded: nan)."""
    return f"{median(r.get('load', float('nan')) for r in runs):.1f}"


def by_sessions(runs: list[dict[str, Any]]) -> list[tuple[int, list[dict[str, Any]], str]]:
    """Each size's runs, smallest first, with its marginal KiB per session: the growth of the median RSS
    from the previous size over the sessions added (empty for the first size)."""
    sizes = sorted({r["sessions"] for r in runs})
    groups = [[r for r in runs if r["sessions"] == n] for n in sizes]
    rss = [median_of(rs, "rss") for rs in groups]
    return [
        (n, rs, f"{(rss[i] - rss[i - 1]) / (n - sizes[i - 1]) / KIB:,.1f}" if i else "")
        for i, (n, rs) in enumerate(zip(sizes, groups, strict=True))
    ]


def fleet_kib(runs: Iterable[dict[str, Any]]) -> str:
    """The fleet process's RSS per edge (median), in KiB."""
    return f"{median(r['fleet_rss'] / r['sessions'] for r in runs) / KIB:,.1f}"


def when(res: dict[str, Any]) -> str:
    """When a series was measured: one time, or the range when sizes were run at different times."""
    stamps = sorted({r.get("measured") or res["measured"] for r in res["runs"]} or {res["measured"]})
    return stamps[0] if len(stamps) == 1 else f"{stamps[0]} to {stamps[-1]} (the sizes in separate runs)"


def mib(n: float) -> str:
    """``n`` bytes in MiB, one decimal."""
    return f"{n / MIB:.1f}"
