"""The report's sections 2 and 2b: how many sessions one hub holds, at what memory and CPU, and its
reconnect storm; then the same with cache streams."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.report import notes, plots
from bench.report.cells import KIB, MIB, by_sessions, fleet_kib, load_at_end, median, median_of, table, when, whole


def capacity_section(res: dict[str, Any], images: Path) -> list[str]:
    """Section 2: the hub series' table, its reconnect storms, plot, profiles, heap and verdicts."""
    runs: list[dict[str, Any]] = res["runs"]
    out = [
        "## 2. Hub capacity",
        "",
        f"*Measured {when(res)}.* The real cloud role (`nodetaskd --role=cloud` via `bench/hubproc.py`,",
        "which only raises RLIMIT_NOFILE first) in its own process, plain ws:// on loopback, default 15 s",
        "heartbeat, log level error; the edges in a second process (`bench/fleet.py`, at most 200 handshakes",
        "at a time; since 2026-11-26 22:00 UTC lean edges, `bench/lean_edge.py`: the protocol over a bare",
        "socket at about a fifth of the CPU per connection of the light edges, `tools/doubles/lightedge.py`,",
        "used before; see the notes for what that changed). Each session costs the hub a token check",
        "(against the token Secrets it watches: no API call; the column says how many Secrets it read one by",
        "one all the same) and a merge patch of the",
        "Node. Memory per session is (hub RSS with all sessions - hub RSS before any) / sessions,",
        "read 3 s after the last Node was marked; the marginal figure is the RSS growth from the previous size",
        "(medians) over the sessions added, which leaves out one-time growth. Steady CPU is the hub's over",
        "30 s of heartbeats only (websocket pings since the fleet's edges list `ping.v1`, as today's agents do;",
        "Heartbeat frames before);",
        "the heartbeat burst is 20,000 heartbeats (at least 5 per edge) sent at once, timed until the hub has",
        "echoed them (its own counter): Heartbeat frames, as agents from before pings keep their sessions alive.",
        "The ping burst is as many websocket pings (each edge's next one after its pong), timed until the last",
        "pong. The report burst is 10,000 reports (at least 2 per edge), each decoded,",
        "checked, passed through the job's coalescing status writer (one GET per 0.2 s window, no PUT because",
        "the change is refused: the reports name a job that does not target these nodes) and answered.",
        "Sessions re-opened counts Hellos beyond one per edge over the whole run: sessions dropped by a hub",
        "too busy to echo heartbeats in time. *µs per* columns are the hub process's CPU-seconds (user +",
        "system) over a burst divided by the messages it handled: unlike its rate, barely blurred by the",
        "fleet's CPU or other load on the same cores.",
        "",
    ]
    sizes = sorted({r["sessions"] for r in runs})
    rows = []
    for n, rs, marginal in by_sessions(runs):
        rows.append(
            (
                whole(n),
                str(len(rs)),
                f"{median_of(rs, 'connect_s'):,.1f}",
                f"{median_of(rs, 'marked_s'):,.1f}",
                f"{median(float(r.get('token_reads', 'nan')) for r in rs):,.0f}",
                f"{median(float(r.get('reopened', 'nan')) for r in rs):,.0f}",
                f"**{median_of(rs, 'per_session_bytes') / KIB:,.1f}**",
                marginal,
                f"{median_of(rs, 'baseline_rss') / MIB:,.0f} MiB",
                f"{median_of(rs, 'steady_cpu_pct'):,.1f}% ({whole(median(notes.keepalives_per_s(r) for r in rs))}/s)",
                f"{whole(median_of(rs, 'heartbeat_burst_per_s'))} ({median_of(rs, 'heartbeat_burst_cpu_pct'):,.0f}%)",
                f"{whole(median_of(rs, 'report_burst_per_s'))} ({median_of(rs, 'report_burst_cpu_pct'):,.0f}%)",
                f"**{median(_cpu_us(r, 'heartbeat') for r in rs):,.0f}**",
                _bold_n(median(_cpu_us(r, "ping") for r in rs)),
                f"**{median(_cpu_us(r, 'report') for r in rs):,.0f}**",
                f"{median_of(rs, 'fleet_cpu_pct'):,.0f}%",
                fleet_kib(rs),
                load_at_end(rs),
            )
        )
    out += table(
        (
            "sessions",
            "runs",
            "connect s (welcomed)",
            "connect s (Nodes marked)",
            "Secrets read",
            "sessions re-opened",
            "hub KiB per session",
            "marginal KiB per session",
            "hub RSS before",
            "steady hub CPU (keep-alives in)",
            "heartbeat echoes/s (hub CPU)",
            "reports answered/s (hub CPU)",
            "hub CPU µs per heartbeat echo",
            "hub CPU µs per ping",
            "hub CPU µs per report",
            "fleet CPU in burst",
            "fleet KiB per edge",
            "load at end",
        ),
        rows,
    )
    out.append("")
    out += _reconnect_table(runs)
    nofile = runs[0]["nofile"] if runs else None
    if nofile:
        out += [f"RLIMIT_NOFILE in the hub process: soft {nofile[0]}, hard {nofile[1]} (raised to the hard limit).", ""]
    if plots.hub(runs, images / "hub_capacity.png"):
        out += ["![benchmark 2](bench/hub_capacity.png)", ""]
    profiled = res.get("profiled")
    if profiled:
        links = " and ".join(f"[`bench/{name}`](bench/{name})" for name in profiled["files"])
        out += [
            f"Where the hub's CPU goes in the bursts: py-spy samples of one more {profiled['sessions']:,}-session run"
            f" ({profiled['measured']}; `--profile-hub`), summarised at the top of {links}.",
            "",
        ]
    heap = res.get("heap")
    if heap:
        out += [
            "Where a session's memory goes: the same `Hub` run in the benchmark process under tracemalloc, heap",
            f"compared before and after {heap['sessions']:,} edges connected (Python allocations only):"
            f" **{heap['python_heap_per_session'] / KIB:.1f} KiB** of Python heap per session, against"
            f" {heap['rss_per_session'] / KIB:.1f} KiB of RSS growth in that process (tracemalloc's own records"
            " inflate the latter). `asyncio/sslproto.py` is the API client's TLS connections, opened during the",
            "connect burst: a fixed cost spread over the sessions here, not a per-session one.",
            "",
            *table(
                ("allocated in", "KiB per session", "objects per session"),
                ((f"`{f}`", f"{b / KIB:.2f}", f"{c:.1f}") for f, b, c in heap["top"]),
            ),
            "",
        ]
    top = [r for r in runs if r["sessions"] == max(sizes)] if sizes else []
    if top:
        per = median(r["per_session_bytes"] for r in top) / KIB
        verdict = "met" if per < 50 and max(sizes) >= 10000 else f"missed by {per - 50:.1f} KiB"
        out += [
            f"**Target.** 10,000 sessions in one process at under 50 KiB each: {whole(max(sizes))} sessions held,"
            f" **{per:.1f} KiB** per session, {verdict}.",
            "",
        ]
        # The next targets (19,000 sessions on 2 cores), judged on the largest size measured with pings.
        pinged = [r for r in runs if r.get("ping_burst_per_s")]
        if pinged:
            n = max(r["sessions"] for r in pinged)
            at = [r for r in pinged if r["sessions"] == n]
            kib = median(r["per_session_bytes"] for r in at) / KIB
            ping = median(_cpu_us(r, "ping") for r in at)
            beat = median(_cpu_us(r, "heartbeat") for r in at)
            report = median(_cpu_us(r, "report") for r in at)

            def met(ok: bool) -> str:
                return "met" if ok else "not met"

            out += [
                f"**Targets for 19,000 sessions** (largest size measured with pings: {n:,}): under 25 KiB of hub"
                f" RSS per session: **{kib:.1f}** ({met(kib < 25 and n >= 19000)}); a keep-alive at most 60 µs of"
                f" hub CPU: **{ping:,.0f}** µs per ping, {beat:,.0f} µs per Heartbeat echo ({met(ping <= 60)}); a"
                f" report at most 200 µs: **{report:,.0f}** µs ({met(report <= 200)}). See the notes for why.",
                "",
            ]
            stormed = [r for r in runs if r.get("reconnect_welcomed_s")]
            if stormed:
                n = max(r["sessions"] for r in stormed)
                at = [r for r in stormed if r["sessions"] == n]
                welcomed, marked = median_of(at, "reconnect_welcomed_s"), median_of(at, "reconnect_marked_s")
                reopened = median_of(at, "reconnect_reopened")
                ok = welcomed <= 30 and marked <= 60 and reopened == 0 and n >= 19000
                out += [
                    f"**Reconnect storm of 19,000** (largest size measured: {n:,}): welcomed within 30 s and marked"
                    f" within 60 s of the restart, none re-opened: **{welcomed:,.1f}** s, **{marked:,.1f}** s,"
                    f" {reopened:,.0f} re-opened ({met(ok)}).",
                    "",
                ]
    return out


def _reconnect_table(runs: list[dict[str, Any]]) -> list[str]:
    """The reconnect storm of each size's runs that measured one (step 7 of the hub-capacity run), and the
    storms that did not complete."""
    measured = [r for r in runs if r.get("reconnect_welcomed_s") and not r.get("reconnect_error")]
    failed = [
        f"- {whole(r['sessions'])} sessions ({r.get('measured', '')}): the storm did not complete:"
        f" {r['reconnect_error']}"
        for r in runs
        if r.get("reconnect_error")
    ]
    if not measured:
        return [*failed, ""] if failed else []
    rows = [
        (
            whole(n),
            str(len(rs)),
            f"{median_of(rs, 'reconnect_ready_s'):,.1f}",
            f"**{median_of(rs, 'reconnect_welcomed_s'):,.1f}**",
            f"**{median_of(rs, 'reconnect_marked_s'):,.1f}**",
            whole(median_of(rs, "reconnect_written")),
            whole(median_of(rs, "reconnect_reopened")),
            f"{median_of(rs, 'reconnect_cpu_s'):,.1f}",
            f"{median(float(r.get('reconnect_fleet_cpu_s', 'nan')) for r in rs):,.1f}",
            load_at_end(rs),
        )
        for n, rs, _ in by_sessions(measured)
    ]
    header = (
        "sessions",
        "runs",
        "hub ready s",
        "welcomed s",
        "Nodes marked s",
        "Node marks written",
        "sessions re-opened",
        "hub CPU s",
        "fleet CPU s",
        "load at end",
    )
    return [
        "**Reconnect storm.** Last in each run, the hub is killed (SIGKILL: it closes no session and unmarks no",
        "Node) and started again with the same hub id and ports; every edge reconnects at once (each backing",
        "off as the agent does while the port is closed: from 0.5 s, doubling to 30 s, jittered; before",
        "2026-11-26 22:00 UTC every second). Seconds from the new process's start: until its /readyz answers",
        "(its Node, job and Task lists taken), until every edge is welcomed again (the fleet's view), until every",
        "session's Node mark is settled. Node marks written are those the new hub wrote: it skips a mark when its",
        "Node watch shows the Node naming this hub and the agent's version already. Sessions re-opened are the",
        "Hellos beyond one per edge three heartbeat intervals after the last mark; hub CPU is the new process's",
        "from its start to the last mark (its imports and lists included), fleet CPU the edges' process's over",
        "the same time: both share the machine's cores.",
        "",
        *table(header, rows),
        "",
        *([*failed, ""] if failed else []),
    ]


def cache_section(res: dict[str, Any]) -> list[str]:
    """Section 2b: the hub series with cache streams, and its verdict."""
    runs: list[dict[str, Any]] = res["runs"]
    pods = res.get("pods_per_node", 0)
    out = [
        "## 2b. Hub capacity with cache streams",
        "",
        f"*Measured {res['measured']}.* As benchmark 2 (the real cloud role in its own process, the edges in a",
        "fleet process, here at most 50 handshakes at a time), with cache streams on and every edge listing",
        "`cache.v1`, in a cluster where each of",
        f"{whole(res.get('cluster_nodes', 0))} nodes has {pods} Pods (each mounting one ConfigMap shared by all; each",
        "node's first Pod also its own ConfigMap). Before any session, the hub's three shared watches (Nodes,",
        "Pods, ConfigMaps) list the whole cluster; its RSS once they have is the baseline. Then every edge",
        "connects and waits for its Node, Pod and ConfigMap collections: for each, the hub lists the node's",
        "Pods and Node by field selector and each ConfigMap it does not hold yet by name, from the API",
        "server's watch cache. Memory per session is (hub RSS with every edge served and every Node marked,",
        "after 3 s - baseline) / sessions.",
        "",
    ]
    sizes = sorted({r["sessions"] for r in runs})
    rows = []
    for n, rs, marginal in by_sessions(runs):
        rows.append(
            (
                whole(n),
                str(len(rs)),
                f"{median_of(rs, 'baseline_rss') / MIB:,.0f} MiB ({median_of(rs, 'listed_s'):,.0f} s)",
                f"{median_of(rs, 'connect_s'):,.1f}",
                f"{median_of(rs, 'cached_s'):,.1f}",
                whole(median_of(rs, "cache_frames")),
                whole(median_of(rs, "config_maps_held")),
                f"{median_of(rs, 'relists'):,.0f} / {median_of(rs, 'list_failures'):,.0f}",
                f"**{median_of(rs, 'per_session_bytes') / KIB:,.1f}**",
                marginal,
                fleet_kib(rs),
                load_at_end(rs),
            )
        )
    out += table(
        (
            "sessions",
            "runs",
            "hub RSS before (watches listed in)",
            "connect s (welcomed)",
            "connect s (all cached)",
            "cache frames",
            "ConfigMaps held",
            "relists / failed lists",
            "hub KiB per session",
            "marginal KiB per session",
            "fleet KiB per edge",
            "load at end",
        ),
        rows,
    )
    out.append("")
    top = [r for r in runs if r["sessions"] == max(sizes)] if sizes else []
    if top:
        per = median(r["per_session_bytes"] for r in top) / KIB
        verdict = "met" if per < 50 else f"missed by {per - 50:.1f} KiB"
        if max(sizes) < 10000:
            verdict = "not measured at 10,000 yet (a smaller size carries more of the hub's fixed growth)"
        out += [
            f"**Target** (autonomy): 10,000 sessions with cache streams and {pods} Pods per node under 50 KiB each:",
            f"{whole(max(sizes))} sessions held, **{per:.1f} KiB** per session, {verdict}.",
            "",
        ]
    return out


def _cpu_us(run: dict[str, Any], burst: str) -> float:
    """The hub's CPU per message of a burst, in µs: its CPU share over the burst's message rate."""
    rate = float(run.get(f"{burst}_burst_per_s", 0.0))
    return float(run[f"{burst}_burst_cpu_pct"]) / 100 / rate * 1e6 if rate else float("nan")


def _bold_n(x: float) -> str:
    """``x`` in bold, or nothing when it was not measured (runs from before the measurement)."""
    return "" if math.isnan(x) else f"**{x:,.0f}**"
