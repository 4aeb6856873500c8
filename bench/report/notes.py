"""The report's closing notes: where the time goes, why a target is missed, what would close the gap.

The observations that come from one-off profiles (py-spy samples) are stated as such; the numbers
in the text are computed from the stored results.
"""

from __future__ import annotations

from typing import Any

from bench.report.cells import KIB, MIB, median

HEARTBEAT_S = 15.0
"""The hub-capacity benchmark's heartbeat interval (``bench.hub_process.HEARTBEAT_S``)."""


def keepalives_per_s(run: dict[str, Any]) -> float:
    """Keep-alives a second in a hub run's steady phase: the Heartbeats the hub counted, or, from a fleet
    that pings (the hub's code never sees a ping), one per edge per interval."""
    return float(run["steady_heartbeats_per_s"]) or run["sessions"] / HEARTBEAT_S


def write(results: dict[str, Any]) -> list[str]:
    """The notes section, from the stored results."""
    out = ["## Notes: where the time goes, and what would close the gaps", ""]
    if "job_cost" in results:
        out += _job_notes(results["job_cost"]["runs"])
    if "diagnosis_cost" in results:
        out += _diagnosis_notes(results["diagnosis_cost"]["runs"])
    if "hub_capacity" in results:
        out += _hub_notes(results["hub_capacity"])
    if "hub_cache" in results:
        out += _hub_cache_notes(results["hub_cache"], results.get("hub_capacity", {}).get("runs", []))
    if "codec" in results:
        c = results["codec"]
        out += [
            "**Codec.** Parsing a new route is "
            f"{c['route_share']:.0%} of a report's decode: one regular expression over the whole route and",
            "an immutable `Route`, the same code on both sides, so it caps the ratio for a node task's first report",
            "however fast msgspec reads the rest. The decoders therefore memoise it (`messages.parse_route`,",
            "an LRU of 16,384 routes, one per node task in flight): every later report of the node task, and",
            "every redelivery, costs a dictionary lookup. Encoding (the route is only formatted) and heartbeats",
            "(no route) need no such help.",
            "",
        ]
    if "edge_footprint" in results:
        out += _edge_notes(results["edge_footprint"])
    return out


def _hub_cache_notes(res: dict[str, Any], plain: list[dict[str, Any]]) -> list[str]:
    runs: list[dict[str, Any]] = res["runs"]
    if not runs:
        return []
    top = max(r["sessions"] for r in runs)
    at_top = [r for r in runs if r["sessions"] == top]
    per = median(r["per_session_bytes"] for r in at_top) / KIB
    plain_top = [r for r in plain if r["sessions"] == top]
    plain_per = median(r["per_session_bytes"] for r in plain_top) / KIB if plain_top else float("nan")
    cached = median(r["cached_s"] for r in at_top)
    requests = top * 4
    return [
        f"**Hub capacity with cache streams.** At {top:,} sessions a cache session costs the hub {per:.1f} KiB,"
        f" against {plain_per:.1f} KiB for a session alone (benchmark 2): its node's Pods' versions and references",
        "(never the Pods, which go from the watch or a list straight to the edge), its own ConfigMap held once",
        "(a shared one once for all), its feed, and the allocator's share of the frames passing through; under",
        "tracemalloc, in-process, the cache's own structures are about 5 KiB a session. The baseline includes",
        "the three watches listing the whole cluster: a watch's snapshot keeps only each object's head, so",
        "listing every Pod never holds them all (the first version kept whole objects and started at 395 MiB).",
        f"Connecting costs more than marks alone: each session is three lists besides its mark, {requests:,}",
        f"requests in all through the API client's 64 at a time, which drained in {cached:.0f} s here (all",
        "cached), where the marks alone take about two minutes; every list is served from the API server's",
        "watch cache (a node's Pods through its `spec.nodeName` index, 1 to 2 ms each). Reading each Node",
        "from its mark's answer instead of a list would save a quarter of them.",
        "",
    ]


def _edge_notes(res: dict[str, Any]) -> list[str]:
    runs: list[dict[str, Any]] = res["runs"]
    if not runs:
        return []
    idle = median(r["idle"]["rss"] for r in runs) / MIB
    puller = median(r["peak_total_rss"] - r["peak_rss"] for r in runs) / MIB
    return [
        f"**Edge footprint.** An idle agent is {idle:.1f} MiB, and the import table says where it goes: the",
        "interpreter, then trio and anyio (with the `ssl` and `socket` machinery they load), structlog (which",
        "loads asyncio), trio-websocket, msgspec, sqlite3, and the agent's own modules; a TLS session to the hub",
        "adds about 1 MiB. Four choices keep it there. The base install is the edge's: the API client, metrics,",
        "certificates and the demo's terminal UI are extras (`[cloud]`, `[demo]`), and an import contract keeps",
        "the edge off them; structlog alone would load rich, about 4 MiB, if it were installed. What only some",
        "jobs need is loaded by them: psutil by the first Check (`roles/edge/checks/host.py`), the registry client by",
        "the first upgrade, PyYAML by the first config update (through `msgspec.yaml`). And grpcio with",
        "protobuf, the CRI client and about 10 MiB, is never loaded by the agent: each pull runs in a child",
        "process (`roles/edge/runtime/puller.py`), which",
        f"costs {puller:.0f} MiB while it runs and nothing after; in-process, an agent that had pulled once",
        "stayed at about 56 MiB for good (measured before the change: 55.7 MiB). The price is a process start",
        "per Pull action (a fraction of a second, small next to a pull) and a peak during pulls of the two",
        "processes together.",
        "The margin is about 1 MiB. Further cuts if it shrinks: fewer glibc malloc arenas for the agent's",
        "worker threads (`MALLOC_ARENA_MAX=2` in the unit file), and the agent version without",
        "`importlib.metadata` (it loads the `email` package).",
        "",
    ]


def _diagnosis_notes(runs: list[dict[str, Any]]) -> list[str]:
    quick = [r for r in runs if r["nodes"] == 1000 and not r.get("jitter") and r["timeline"]]
    if not quick:
        return []

    def med(key: str) -> float:
        return median(r["timeline"].get(key, float("nan")) for r in quick)

    first = med("stage 1 created until") - med("stage 1 created from")
    second = med("stage 2 created until") - med("stage 2 created from")
    load = median(r.get("load", float("nan")) for r in quick)
    lag = median(r["seconds"] - r["timeline"].get("stage 2 ended until", float("nan")) for r in quick)
    return [
        "**Diagnosis cost.** A diagnosis is made of objects: one Task per node and stage, created by the",
        "controller and written by a hub, so its writes grow with nodes x stages where a job's grow with its",
        "duration. Its time goes into creating them: with edges that answer at once, each stage ends about",
        "when its last Task is created, and creating 1,000 Tasks (through the client's 64 requests in flight)",
        f"took {first:.0f} s for the first stage and {second:.0f} s for the second (medians; the machine's load",
        f"was about {load:.0f} on 2 cores, from other runs beside these, so the API server had a fraction of a",
        "core, as had the benchmark process, which runs the hub and its 1,000 sessions too). Between two stages",
        "the controller writes the Diagnosis once and starts creating; its watch showed the end about",
        f"{lag:.0f} s after the last Task's result. The cProfile (linked above) has none of the controller's own",
        "code among its top functions: the time is the API server's, the websocket traffic's and the bridge's.",
        "A stage's Tasks could be created faster only with fewer requests (KubeDiag's API has one object per",
        "node and stage) or a less loaded API server.",
        "",
    ]


def _job_notes(runs: list[dict[str, Any]]) -> list[str]:
    out = [
        "**Job cost.** Coalescing is what makes the write count independent of the number of reports: the",
        "writer applies every change submitted in a 0.2 s window to one fresh copy of the job and writes once,",
        "so a 100-node job takes 2-3 writes instead of 300, and the writes of a larger job grow with its",
        "duration, not its reports. Without it every claim and every report is its own GET + PUT of the whole",
        "object, serialised per job. Each batch the hub writes also carries `nodeCounts`; the controller, which",
        "recomputes them after every change of the job, finds them right and writes only when the job's phase",
        "moves or a node times out. Before, it wrote after every hub write, and those writes caused most of",
        "the conflicts: a 1,000-node job cost 24 controller writes and 12 hub 409s (the table has today's).",
        "",
    ]
    off = [r for r in runs if not r["window"] and r["hub_writes"]]
    if off:
        big = max(off, key=lambda r: r["nodes"])
        per_write = big["seconds"] / big["hub_writes"]
        counts = {n: sum(r["nodes"] == n for r in off) for n in sorted({r["nodes"] for r in off})}
        ran = ", ".join(f"{n:,} nodes ({c} run{'s' if c > 1 else ''})" for n, c in counts.items())
        out += [
            f"Coalescing off was run at {ran}; the larger sizes are cut off at a time limit. Each node needs 3",
            f"writes (claim, Check, Pull), one after the other. At {big['nodes']:,} nodes a write took"
            f" {per_write:.2f} s on average, so a 5,000-node job would need at least 15,000 x {per_write:.2f} s ="
            f" {15000 * per_write / 3600:.1f} h, more as its object grows. Impractical, so not run.",
            "",
        ]
    out += [
        "Where the time goes with coalescing on. The cProfile of a 1,000-node job (linked above) shows the hub +",
        "controller process waiting in `epoll` for about a third of the job (for the API server, which burns",
        "more CPU than the hub: table), then msgspec decoding whole job objects (every GET of a read-modify-write",
        "and every watch event, in both the hub's and the controller's watch), then trio's per-task costs of",
        "the sessions. An earlier profile also showed two scans of every node entry per change (finding a",
        "node's entry, and a claim counting the InProgress ones); the first is now a map kept per job, the",
        "second a count in C, and the controller no longer rewrites the status after each hub write.",
        "",
        "A big job's duration still grows faster than its size: each write costs time in proportion to the",
        "object, and a node task needs three writes in turn (claim, then its reports, then the runner sees its",
        "slot free), so some of the 100 slots are empty while a write is in flight. What would shorten it:",
        "(1) a JSON patch of the changed entries with a resourceVersion test instead of GET + PUT of everything",
        "(saves the hub's GET, decode and encode; the API server still rewrites the whole object); (2) claiming",
        "the next node as soon as a node's final report is submitted, instead of after it has been written and",
        "echoed back.",
        "",
        "**The 1 MiB target at 5,000 nodes.** KubeEdge's status layout costs about 340 bytes a finished node",
        "(its action flow with a time per action, its image statuses, its dispatch time): past 1 MiB at about",
        "3,000 nodes and past etcd's request limit at about 4,500, where an earlier run of this benchmark",
        "stalled for good (every status write refused). Jobs of more than `compactStatusAbove` nodes (a hub",
        "setting, default 1,000) therefore keep a compact entry for each node that succeeded: its last action",
        "only, and no `imageStatus` when every image was pulled (the spec's list says the same). Failed and",
        "running nodes keep every detail, so a job whose nodes mostly fail can still outgrow the limit; keeping",
        "per-node results outside the job object (one small object per shard of nodes) would remove the",
        "limit altogether, at the cost of KubeEdge's API shape. KubeEdge itself advises at most 100 nodes a job.",
        "",
    ]
    return out


def _hub_notes(res: dict[str, Any]) -> list[str]:
    runs: list[dict[str, Any]] = res["runs"]
    sizes = sorted({r["sessions"] for r in runs})
    out = ["**Hub capacity.**"]
    if len(sizes) >= 2:
        lo, hi = sizes[0], sizes[-1]
        rss_lo = median(r["rss"] for r in runs if r["sessions"] == lo)
        rss_hi = median(r["rss"] for r in runs if r["sessions"] == hi)
        marginal = (rss_hi - rss_lo) / (hi - lo) / KIB
        fixed = (rss_lo - median(r["baseline_rss"] for r in runs if r["sessions"] == lo)) / MIB - marginal * lo / KIB
        out += [
            f"Memory is a fixed part plus a part per session: from {lo:,} to {hi:,} sessions the hub grew by"
            f" {marginal:.1f} KiB per added session, and about {fixed:.0f} MiB of the growth does not depend on the",
            "number of sessions (the API client's connection pool filling up during the connect burst - up to",
            "100 TLS connections for the Node patches - and allocator arenas that do not shrink",
            "afterwards). Per-session figures at small sizes are therefore inflated by that fixed part.",
        ]
    out += [
        "What a session holds: since the hub serves edges through its own websocket layer",
        "(`roles/cloud/transport/ws_server.py`: wsproto for the HTTP upgrade, then a frame codec of its own over a",
        "non-blocking socket with OpenSSL's TLS), a connection is a socket, a small read buffer and the",
        "frame state, with no reader task, memory channel or events of its own; the upgrade request and its",
        "HTTP parser are freed once answered. Then the hub's one task for the session, the `Session`, a",
        "structlog logger bound to the node and the cached token (the tracemalloc table above).",
        "",
        "Connecting: a session costs the hub no API call before its Welcome. The token check used to be a",
        "Secret GET; the hub now watches the labelled token Secrets, so it is a dictionary lookup (the",
        "Secrets read column). The Node mark, a merge patch, runs beside the session, which reads and echoes",
        "heartbeats while the mark waits; the API client keeps at most 64 requests in flight, so marks queue",
        "on the trio side instead of inside aiohttp. Welcomes are therefore bound by the handshakes, and the",
        "Nodes-marked column by the patches through the one trio-asyncio bridge. A hub that marked before",
        "reading let sessions wait behind thousands of marks until their edges gave up on them (the",
        "sessions re-opened column), and, with no bound, held thousands of queued requests in memory.",
        "A fleet reconnecting to a restarted hub costs no patch for a Node that names this hub and the agent's",
        "version already: the hub's one Node watch (the cache streams', else its own) says which do, and the",
        "hub opens its door once that watch has listed the Nodes (the reconnect storm table).",
        "",
        "Where a message's CPU goes. py-spy samples of the bursts before this series' changes",
        "([`bench/profile-hub-1000-heartbeat-before.txt`](bench/profile-hub-1000-heartbeat-before.txt),",
        "[`bench/profile-hub-1000-report-before.txt`](bench/profile-hub-1000-report-before.txt)) showed",
        "a quarter to a third of a heartbeat echo's and a report's hub CPU in the hub's own",
        "bookkeeping around trio-websocket: a cancel scope per frame for the missed-heartbeat deadline (about",
        "13 µs each here), labelled-metric lookups, a hand-off to the session's writer task through an anyio",
        "memory stream, and for each report anyio's task with its own cancel scope and event. Measured the",
        "same way at 1,000 sessions on the same day (medians of 3 runs, the machine shared with other test",
        "runs): 322 µs per heartbeat echo and 721 µs per report before. Now one task per hub keeps every",
        "session's deadline from when its link last heard anything, waking only at the first deadline; the",
        "echo is written by the receive loop itself when nothing else is being written; metric children are",
        "looked up once; reports run as plain trio tasks. Agents listing `ping.v1` no longer send Heartbeat",
        "frames at all: trio-websocket's reader answers their websocket pings, and the hub's own code does",
        "not run for them (1.5% of the ping burst's samples). Those changes alone measured (same day, 3 runs",
        "at 1,000 sessions): about 300 µs per echo, 210 µs per ping and 530 µs per report.",
        "",
        "The rows of the table were measured at different times, with the code and fleet of their day: the",
        "1,000, 10,000 and 19,000-session rows on the final code of 2026-11-26 with the lean fleet on a quiet",
        "machine, the 5,000-session row with the code and light fleet of that morning; compare within a",
        "row, and the marginal memory only between rows of one day. Memory per session at 10,000 and",
        "19,000 rose with the lean fleet (14.8 and 13.7 KiB with the light one, the code of that afternoon):",
        "that fleet connects three times as fast, so thousands of Node marks wait at once (19,000 welcomed",
        "in 26 s, marked in 65 s, where the light fleet's edges came as fast as marks were written), and",
        "the allocator keeps that peak. Likely rather than shown: the per-session Python heap did not grow",
        "(the tracemalloc table, with the lean fleet too).",
        "",
        "The fleet. Until the evening of 2026-11-26 the fleet's edges were light edges",
        "(`tools/doubles/lightedge.py`, over trio-websocket), which cost the fleet 5.7 to 7.4 ms of CPU per",
        "reconnect and a whole core in every burst, against 1.3 ms of the hub's: a storm timed how fast the",
        "fleet could dial. The lean edges (`bench/lean_edge.py`: the same protocol over a bare socket,",
        "pings only, no actions) cost it 1 to 2 ms. A faster fleet also changes what the hub is measured",
        "under: frames arrive closer together and the hub handles more of them per wake-up, so its CPU per",
        "message falls. Both, on the same code the same evening at 1,000 sessions: light fleet (3 runs)",
        "57.5 µs per echo, 48 per ping, 157 per report; lean fleet (1 run) 48.5, 35 and 108, against 67, 53",
        "and 182 for the code of the previous row of that size. Roughly half of the echo's drop and a third",
        "of the report's is the hub's code, the rest the fleet. The hub's side, from py-spy samples of the",
        "bursts: frames counted in plain integers read at scrape time (a labelled prometheus Counter takes",
        "a lock per increment, 3.6% of an echo's samples); after a plain socket's short read the next read",
        "waits for the socket to be readable instead of failing once (a system call and an exception per",
        "message); trio's clock and events where anyio's wrappers cost 1.1 µs against 0.3 per clock read",
        "and 2.6 µs against 0.4 per event, on every frame written and every report; report timestamps",
        "through `time.strftime` (3.0 µs against 8.4); a report no longer yields once on the job cache's",
        "synced event.",
        "",
        "The reconnect storm. A hub that refused every connection past its handshake places (500 when",
        "`maxSessions` is 19,000 on a 20,000 file limit) sent most of a storm away to retry on its own",
        "timers: the storm of 19,000 did not complete in 950 s in the previous series. Now a connection",
        "that finds every place taken waits for one for up to a second (they turn over within milliseconds",
        "in a storm; after a second, refusing at once resumes until a place is free), and the port has",
        "eight kernel accept queues (`SO_REUSEPORT`) instead of one of `net.core.somaxconn` (4,096), so the",
        "edges wait in arrival order rather than in TCP's retry timers. The fleet backs off as the agent",
        "does (from 0.5 s, doubling to 30 s, jittered), which adds up to a ceiling's worth of waiting after",
        "the hub is back: the 1,000-session storm takes longer than with a retry every second.",
        "",
        "The rest is the cost of a wake-up. A bare trio-websocket server (no hub code) answering pings from",
        "1,000 connections used 150-210 µs of CPU per ping on this machine, 140 µs with CPython's young",
        "generation collected every 20,000 allocations instead of 700 (the cloud role freezes what its startup",
        "loaded and uses that threshold, `roles/common/gc_tuning.py`). The same bare test with 500 clients: 236",
        "µs per TLS ping through trio-websocket over `trio.SSLStream`, 163-228 with wsproto driven by one task",
        "over it, 111 over a non-blocking `ssl.SSLSocket`; wsproto's frame layer then cost 27 µs per received",
        "frame against 3 for the hub's own codec. Hence the hub's layer (53-57 µs per ping at 1,000 and",
        "10,000 sessions when it came, with the light fleet). What is left is mostly the send and recv",
        "system calls (a third of the samples, with the peer's TCP work on loopback) and trio's epoll wait",
        "per read: every message is its own wake-up",
        "while the fleet keeps the hub mostly idle; a busier hub batches and pays less per message.",
        "The lean fleet is still the slower side in every burst (its CPU in the table): on 2 cores the",
        "burst rates are a lower bound of what the hub can do alone.",
        "",
    ]
    if sizes:
        top = [r for r in runs if r["sessions"] == sizes[-1]]
        steady = median(r["steady_cpu_pct"] for r in top)
        per_beat = steady / 100 / median(keepalives_per_s(r) for r in top) * 1e6
        out += [
            f"Holding {sizes[-1]:,} idle sessions at the default 15 s heartbeat costs the hub {steady:.0f}% of one",
            f"core, about {per_beat:.0f} µs of CPU per keep-alive (a ping, or a Heartbeat received and echoed) with",
            "everything else the hub does meanwhile. The heartbeat interval is the other lever: at 30 s it halves.",
        ]
        pinged = [r for r in top if r.get("ping_burst_per_s")]
        if pinged:
            echo = steady / 100 / median(r["heartbeat_burst_per_s"] for r in pinged) * 1e6
            ping = steady / 100 / median(r["ping_burst_per_s"] for r in pinged) * 1e6
            out.append(
                f"That share runs through every burst of the table: at {sizes[-1]:,} sessions it is about {echo:.0f} µs"
                f" of each heartbeat echo's and {ping:.0f} µs of each ping's hub CPU."
            )
        stormed = [r for r in top if r.get("reconnect_marked_s") and not r.get("reconnect_error")]
        if stormed:
            hub_cpu = median(r["reconnect_cpu_s"] for r in stormed)
            fleet_cpu = median(r["reconnect_fleet_cpu_s"] for r in stormed)
            out += [
                f"In the reconnect storm of {sizes[-1]:,} the new hub used {hub_cpu:.0f} s of CPU (its start and",
                f"lists included: {hub_cpu / sizes[-1] * 1e3:.1f} ms a session) and the fleet {fleet_cpu:.0f} s;",
                "on two cores the time to welcome every edge is bound by their sum.",
            ]
    out.append("")
    return out
