"""The report's sections 1 and 1b: what a node job and a diagnosis cost the API server, against their targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import plots
from bench.report.cells import KIB, MIB, load_at_end, median, table, when, whole

CPU_KEYS = ("hub+controller", "kube-apiserver", "etcd", "edges")
ETCD_LIMIT = 1.5 * MIB
"""etcd's default ``--max-request-bytes``: a larger object cannot be written at all."""


def job_section(res: dict[str, Any], images: Path) -> list[str]:
    """Section 1: the job series' table, plot and verdicts, and the link to its profile."""
    runs: list[dict[str, Any]] = res["runs"]
    out = [
        "## 1. API cost of a job",
        "",
        f"*Measured {when(res)}.* One ImagePrePullJob (two images, `concurrency: 100`, a label selector",
        "matching exactly N nodes) through a real cloud hub (`roles.cloud.hub.Hub`) and the controller's",
        "`Reconciler`, both in the benchmark process, on the local kube-apiserver 1.20.2 + etcd. N light edges",
        "(`tools/doubles/lightedge.py`, the real protocol) run in a separate process, each action taking",
        f"{res['delay'] * 1000:.0f} ms. Every edge is connected (and its Node marked) before the job is created;",
        "the clock stops when the controller's cache shows the job Completed. *Hub writes* are the hub's",
        "successful status PUTs (claims and reports; it writes nothing else meanwhile), *409s* the conflicts",
        "its writes met (each re-read and retried). Controller writes are its status PUTs, finalizer patch",
        "and Events. CPU is seconds of user+system time per process over the job.",
        f"Coalescing on means `coalesce_window={res['window']}` s; off is `0` (one write per change, serial per job).",
        "",
    ]
    groups: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["nodes"], bool(r["window"])), []).append(r)
    rows = []
    for (nodes, on), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], not kv[0][1])):
        done = [r for r in rs if r["completed"]]
        use = done or rs
        seconds = median(r["seconds"] for r in use)
        finished = median(r["finished_nodes"] for r in use)
        time_text = f"{seconds:,.1f}" if done else f"cut at {seconds:,.0f} ({finished:,.0f}/{nodes:,} nodes done)"
        per_node = median(r["hub_writes"] / max(1, r["nodes"] if r["completed"] else r["finished_nodes"]) for r in use)
        cpu = {k: median(r["cpu_s"].get(k, 0.0) for r in use) for k in CPU_KEYS}
        rows.append(
            (
                whole(nodes),
                "on" if on else "off",
                f"{len(done)}/{len(rs)}",
                time_text,
                whole(median(r["hub_writes"] for r in use)),
                f"{per_node:.3f}",
                whole(median(r["hub_conflicts"] for r in use)),
                f"{whole(median(r['controller_writes'] for r in use))} /"
                f" {whole(median(r['controller_conflicts'] for r in use))}",
                f"{median(r['object_bytes'] for r in use) / KIB:,.0f} KiB",
                " / ".join(f"{cpu[k]:,.1f}" for k in cpu),
                load_at_end(use),
            )
        )
    out += table(
        (
            "nodes",
            "coalescing",
            "completed runs",
            "seconds to Completed (median)",
            "hub status writes",
            "writes per node",
            "hub 409s",
            "controller writes / 409s",
            "final object",
            "CPU s: hub+controller / apiserver / etcd / edges",
            "load at end",
        ),
        rows,
    )
    out.append("")
    if plots.job(runs, images / "job_cost.png"):
        out += ["![benchmark 1](bench/job_cost.png)", ""]
    out += _job_verdict(runs)
    profiled = res.get("profiled")
    if profiled:
        out += [
            f"A profile of one more {profiled['nodes']:,}-node job (cProfile in the hub + controller process, which",
            f"slows it: {profiled['seconds']:.0f} s) is in [`bench/{profiled['file']}`](bench/{profiled['file']}).",
            "",
        ]
    return out


def _job_verdict(runs: list[dict[str, Any]]) -> list[str]:
    out = ["**Targets.**", ""]
    k1 = [r for r in runs if r["nodes"] == 1000 and r["window"] and r["completed"]]
    if k1:
        per = median(r["hub_writes"] / r["nodes"] for r in k1)
        verdict = "met" if per < 0.2 else f"missed by {per - 0.2:.3f}"
        out.append(f"- Under 0.2 status writes per node at N = 1,000 with coalescing: **{per:.3f}**, {verdict}.")
        out.append(
            "  KubeEdge's design writes at least once per action report, 2 per node for a pre-pull (Check, Pull):"
            f" {2 / per:.0f} times as many."
        )
        off = [r for r in runs if r["nodes"] == 1000 and not r["window"]]
        if off:
            r = off[0]
            done = max(1, r["finished_nodes"])
            how = "completed" if r["completed"] else f"cut off after {r['seconds']:.0f} s with {done:,} nodes done"
            per_done = r["hub_writes"] / done
            out.append(f"  Without coalescing the same job made {per_done:.2f} writes per finished node ({how}).")
    big = [r for r in runs if r["nodes"] == 5000 and r["window"]]
    if big:
        r = big[0]
        size = r["object_bytes"]
        if r["completed"]:
            verdict = "met" if size < MIB else f"missed: {size / MIB:.2f} MiB, {size / MIB - 1:.0%} over"
            out.append(
                f"- The 5,000-node job completing with its object under 1 MiB: completed in {r['seconds']:,.0f} s"
                f" (1 run), object **{size / MIB:.2f} MiB**, {verdict}."
            )
        else:
            how = "it stalled: no status change for 180 s" if r.get("stalled") else "cut off at the time limit"
            out.append(
                f"- The 5,000-node job completing with its object under 1 MiB: **missed, not completed**; {how}"
                f" after {r['seconds']:,.0f} s, with {r['finished_nodes']:,} nodes done and the object at"
                f" {size / MIB:.2f} MiB ({size / MIB - 1:.0%} over 1 MiB)."
            )
            errors = r.get("last_errors", {})
            if errors:
                counts = r.get("warnings", {})
                out.append("  The hub's and controller's warnings during the run (count, last error):")
                out += [f"  - `{ev}` x{counts.get(ev, 0)}: {text}" for ev, text in sorted(errors.items())]
        entry = r.get("sample_entry", "")
        if entry:
            per_node = len(entry) + 1
            compact = '"imageStatus"' not in entry
            kind = "compact entry (the job has more than `compactStatusAbove` nodes)" if compact else "entry"
            out += [
                "",
                f"  A finished node's {kind} is {per_node} bytes of JSON, so the status alone is about"
                f" {per_node * 5000 / MIB:.2f} MiB at 5,000 nodes: under 1 MiB up to about"
                f" {int(MIB / per_node):,} nodes, and etcd's default request limit (1.5 MiB) refuses the write"
                f" beyond about {int(ETCD_LIMIT / per_node):,}. The entry, as stored:",
                "",
                "  ```json",
                f"  {entry}",
                "  ```",
            ]
    out.append("")
    return out


def _stage(runs: list[dict[str, Any]], stage: int) -> str:
    """``created from-until, ended`` of a stage (medians), from each run's timeline."""

    def med(what: str) -> float:
        return median(r["timeline"].get(f"stage {stage} {what}", float("nan")) for r in runs)

    return f"{med('created from'):.0f}-{med('created until'):.0f}, {med('ended until'):.0f}"


def diagnosis_section(res: dict[str, Any]) -> list[str]:
    """Section 1b: the diagnosis series' table and verdict, and the link to its profile."""
    runs: list[dict[str, Any]] = res["runs"]
    out = [
        "## 1b. API cost of a diagnosis",
        "",
        f"*Measured {when(res)}.* A two-stage Diagnosis (`start -> first -> second`, a label selector matching",
        "exactly N nodes) through the same real hub (`roles.cloud.tasks.watch` dispatches the Tasks, with the same",
        f"coalescing window, {res['window']} s) and the controller's `DiagnosisController`, both in the benchmark",
        "process, on the local kube-apiserver 1.20.2 + etcd. The N light edges acknowledge each Task and report,",
        "after the delay in the table, a small fixed results map (`tools/doubles/lightedge.py`: a double for",
        "load, not a processor), which counts the first stage's results the second stage's request carried.",
        "Every edge is connected before the Diagnosis is created; the clock stops when the controller's cache",
        "(its watch) shows it Succeeded, as for a job. *Writes* are every successful create, PUT and patch",
        "of the hub (Task status) and of the controller (Task creations, Diagnosis status and metadata, Events);",
        "*per node per stage* is all of them over N x 2. *Stage N*: seconds from the Diagnosis's creation until its",
        "first and its last Task were created, and until its last Task ended (the API server's timestamps, whole",
        "seconds). *Passed on*: every second-stage result says its request held the first stage's results of",
        "its node.",
        "",
    ]
    groups: dict[tuple[int, float, float], list[dict[str, Any]]] = {}
    for r in runs:
        # Runs stored before the delay was recorded per run had the series' delay.
        key = (r["nodes"], r.get("delay", res.get("delay", 0.0)), r.get("jitter", 0.0))
        groups.setdefault(key, []).append(r)
    rows = []
    for (nodes, delay, jitter), rs in sorted(groups.items()):
        done = [r for r in rs if r["phase"] == "Succeeded"]
        use = done or rs
        cpu = {k: median(r["cpu_s"].get(k, 0.0) for r in use) for k in CPU_KEYS}
        rows.append(
            (
                whole(nodes),
                f"{delay * 1000:,.0f} ms" + (f" + up to {jitter:g} s" if jitter else ""),
                f"{len(done)}/{len(rs)}",
                f"{median(r['seconds'] for r in use):,.1f}",
                _stage(use, 1),
                _stage(use, 2),
                whole(median(r["hub_writes"] for r in use)),
                whole(median(r["controller_writes"] for r in use)),
                f"**{median(r['writes_per_node_stage'] for r in use):.2f}**",
                f"{whole(median(r['hub_conflicts'] for r in use))} /"
                f" {whole(median(r['controller_conflicts'] for r in use))}",
                f"{median(r['object_bytes'] for r in use) / KIB:,.0f} KiB",
                "yes" if all(r["propagated"] for r in use) else "NO",
                " / ".join(f"{cpu[k]:,.1f}" for k in cpu),
                load_at_end(use),
            )
        )
    out += table(
        (
            "nodes",
            "edge delay",
            "runs Succeeded",
            "seconds to Succeeded (median)",
            "stage 1: Tasks created, last ended (s)",
            "stage 2",
            "hub writes",
            "controller writes",
            "writes per node per stage",
            "409s hub / controller",
            "final Diagnosis",
            "passed on",
            "CPU s: hub+controller / apiserver / etcd / edges",
            "load at end",
        ),
        rows,
    )
    out.append("")
    big = {(delay, jitter): rs for (nodes, delay, jitter), rs in groups.items() if nodes == 1000}
    if big:
        per = max(median(r["writes_per_node_stage"] for r in rs) for rs in big.values())
        verdict = "met" if per <= 3 else f"missed by {per - 3:.2f}"
        hub = ", ".join(
            f"{median(r['hub_writes'] for r in rs) / 2000:.2f} with edges taking"
            f" {delay * 1000:,.0f} ms{f' + up to {jitter:g} s' if jitter else ''}"
            for (delay, jitter), rs in sorted(big.items())
        )
        out += [
            f"**Target** (about 3 API writes per node per stage at most, N = 1,000): **{per:.2f}**, {verdict}.",
            f"Per Task: the controller's create, and hub writes ({hub}): startTime, Accepted and the result are",
            "changes to the Task's coalescing status writer, one write when the edge answers within its window, two",
            "when it takes longer (startTime with Accepted, then the result). The Diagnosis's own status is written",
            "a few times a stage, not once per Task: a status that only counts more ended Tasks waits until 2 s",
            "after the last write (a stage's verdict is written at once).",
            "",
        ]
    profiled = res.get("profiled")
    if profiled:
        out += [
            f"A profile of one more {profiled['nodes']:,}-node Diagnosis (cProfile in the hub + controller process,",
            f"which slows it: {profiled['seconds']:.0f} s) is in"
            f" [`bench/{profiled['file']}`](bench/{profiled['file']}).",
            "",
        ]
    return out
