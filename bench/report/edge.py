"""The report's section 4: an edge agent's memory, idle, during a pull, under its launcher, with its cache."""

from __future__ import annotations

import statistics
from typing import Any

from bench.report.cells import mib, table


def edge_section(res: dict[str, Any]) -> list[str]:
    """Section 4: the agent's memory, what its imports cost, its launcher and its cache, and the verdict."""
    runs: list[dict[str, Any]] = res["runs"]
    out = [
        "## 4. Edge footprint",
        "",
        f"*Measured {res['measured']}.* One real agent (`python -m roles.cli --role=edge`) per run, started by the",
        "interpreter of a virtualenv holding only the base install's dependencies (what a device installs; no",
        "cloud or demo extra), connected over TLS (a generated CA in `caFile`) to a minimal hub in the benchmark",
        "process (the real codec over trio-websocket: welcome, heartbeat echoes, report acks), with its SQLite",
        "store and a real containerd",
        f"on loopback. *Idle*: {res['settle_s']:.0f} s after the Welcome, the median of three readings a second",
        "apart. *During a pull*: the hub dispatches an ImagePrePullJob (Check, Pull) of an image with one",
        f"{res['layer_mib']} MiB layer, new to containerd; RSS sampled every 20 ms until the Pull report (the"
        " pull runs in a child process, `roles/edge/runtime/puller.py`, counted in the second peak)."
        f" *After*: {res['settle_s']:.0f} s later.",
        "RSS counts shared libraries' resident pages; USS is the memory only this process holds; PSS shares",
        f"the rest among the processes mapping it. Medians of {len(runs)} runs, in MiB.",
        "",
    ]
    if not runs:
        return [*out, "No run completed.", ""]

    def med(path: tuple[str, ...]) -> float:
        values = []
        for r in runs:
            v: Any = r
            for key in path:
                v = v[key]
            values.append(float(v))
        return statistics.median(values)

    rows = [
        ("idle", mib(med(("idle", "rss"))), mib(med(("idle", "uss"))), mib(med(("idle", "pss")))),
        ("peak during a pull: the agent", mib(med(("peak_rss",))), "", ""),
        ("peak during a pull: the agent and its image puller", mib(med(("peak_total_rss",))), "", ""),
        (
            "idle after a pull",
            mib(med(("after_pull", "rss"))),
            mib(med(("after_pull", "uss"))),
            mib(med(("after_pull", "pss"))),
        ),
    ]
    out += table(("agent", "RSS MiB", "USS MiB", "PSS MiB"), rows)
    out += ["", f"The pull took {med(('pull_s',)):.2f} s (median).", ""]
    steps: list[dict[str, Any]] = res.get("imports", [])
    if steps:
        out += [
            "Where an idle agent's memory goes: the RSS of fresh interpreters of the same virtualenv importing",
            "the agent's parts, each row adding to the ones above (medians of three):",
            "",
        ]
        previous = 0
        table_rows = []
        for step in steps:
            table_rows.append((step["what"], mib(step["rss"]), f"+{mib(step['rss'] - previous)}" if previous else ""))
            previous = step["rss"]
        out += table(("imported", "RSS MiB", "added"), table_rows)
        out.append("")
    launcher: dict[str, Any] | None = res.get("launcher")
    if launcher:
        out += [
            "The launcher (`python -m roles.edge.launcher`, which supervises the agent on a device and rolls back",
            f"a bad upgrade), {res['settle_s']:.0f} s after its agent's Welcome (one run, medians of three readings):",
            "",
        ]
        out += table(
            ("process", "RSS MiB", "USS MiB", "PSS MiB"),
            [
                (name, mib(launcher[name]["rss"]), mib(launcher[name]["uss"]), mib(launcher[name]["pss"]))
                for name in ("launcher", "agent")
            ],
        )
        out.append("")
    out += _cache_rows(res)
    idle = med(("idle", "rss"))
    verdict = "met" if idle < 40 * (1 << 20) else f"missed by {mib(idle - 40 * (1 << 20))} MiB"
    out += [f"**Target** (an idle agent under 40 MiB): **{mib(idle)} MiB** RSS, {verdict}.", ""]
    return out


def _cache_rows(res: dict[str, Any]) -> list[str]:
    """The idle agent with its cache filled, the local API off and on, and lists from that cache."""
    runs: list[dict[str, Any]] = res.get("cache", [])
    if not runs:
        return []
    out = [
        "With edge autonomy's cache: a fresh agent (no container runtime) whose hub lists `cache.v1`, requests",
        "autonomy and relists the node (its Node, 10 Pods of about 4 KiB of JSON each, a ConfigMap) into the",
        f"agent's store; memory {res['settle_s']:.0f} s after the agent reported its condition True, with",
        "nothing more on, with the local API on, and with its metrics on (`metrics.enabled`, scraped once",
        "before): runs alternated, medians of each:",
        "",
    ]
    rows = []
    for what, api, metrics in (("", False, False), ("local API on", True, False), ("metrics on", False, True)):
        chosen = [r["idle"] for r in runs if r["local_api"] is api and r.get("metrics", False) is metrics]
        if not chosen:
            continue
        rows.append(
            (
                f"idle, cache filled{', ' + what if what else ''} ({len(chosen)} runs)",
                *(mib(statistics.median(float(m[key]) for m in chosen)) for key in ("rss", "uss", "pss")),
            )
        )
    out += table(("agent", "RSS MiB", "USS MiB", "PSS MiB"), rows)
    lists = [r["list_pods"] for r in runs if r.get("list_pods")]
    if lists:
        name = "list pods (spec.nodeName)"
        median = statistics.median(float(r[name]["median_ms"]) for r in lists)
        p99 = statistics.median(float(r[name]["p99_ms"]) for r in lists)
        out += [
            "",
            f"`GET /api/v1/pods?fieldSelector=spec.nodeName=<node>` ({lists[0]['items']} Pods,"
            f" {lists[0]['response_bytes']:,} bytes) from that agent's durable cache, over one keep-alive",
            f"loopback connection from the benchmark process: median **{median:.2f} ms**, p99 {p99:.2f} ms"
            f" (target: under 5 ms at the median; medians over the runs of each run's figure).",
        ]
    return [*out, ""]
