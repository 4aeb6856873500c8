"""The report's device-as-a-node rows (issue 25): the node API endpoint's added latency, the hub's CPU per
relayed request and for N nodes' steady kubelet traffic, and the agent's memory with the endpoint on."""

from __future__ import annotations

from typing import Any

from bench.report.cells import load_at_end, median, mib, table, whole

ADDED_GOAL_MS = 5.0
SHARE_GOAL = 1.0
MEMORY_GOAL_MIB = 45.0


def latency_section(res: dict[str, Any]) -> list[str]:
    """The endpoint beside the API server, the CPU per relayed request, and the agent at rest."""
    runs: list[dict[str, Any]] = res["runs"]
    out = [
        "## 5. A device as a Kubernetes node: the node API endpoint",
        "",
        f"*Measured {res['measured']}* (`bench/node_api_latency.py`). A real hub with `apiRelay` on and a real",
        "agent (device interpreter) with `nodeApi` on, the node's client certificate in its `credentialsDir`",
        f"(issued by the cluster CA), {res['pods']} Pods bound to the node. Two keep-alive connections, as a",
        "kubelet holds them: one to the agent's endpoint (plain HTTP on loopback; the agent speaks TLS as the",
        "node through a tunnel in its hub session, the hub relays to the API server), one straight to the API",
        "server over TLS with the same certificate; after a warm-up, requests alternate between the two, one at",
        "a time; times are the client's, to the parsed end of the answer. Added = relayed median - direct",
        f"median. Medians over {len(runs)} runs (each a fresh hub and agent) of"
        f" {runs[0]['rounds'] if runs else 0:,} requests per row; load average at the end"
        f" {load_at_end(runs)}.",
        "",
    ]
    if not runs:
        return [*out, "No run completed.", ""]
    rows = []
    for name in runs[0]["relayed"]:

        def rel(key: str, name: str = name) -> float:
            return median(r["relayed"][name][key] for r in runs)

        def dire(key: str, name: str = name) -> float:
            return median(r["direct"][name][key] for r in runs)

        added = median(r["added_median_ms"][name] for r in runs)
        verdict = "met" if added < ADDED_GOAL_MS else "NOT met"
        rows.append(
            (
                name, f"{dire('median_ms'):.2f}", f"{dire('p99_ms'):.2f}", f"{rel('median_ms'):.2f}",
                f"{rel('p99_ms'):.2f}", f"**{added:.2f}** ({verdict}: < {ADDED_GOAL_MS:g} ms)",
            )
        )  # fmt: skip
    header = ("request", "direct median ms", "direct p99 ms", "relayed median ms", "relayed p99 ms", "added median")
    out += table(header, rows)
    hub_ms = median(r["hub_cpu_ms_per_request"] for r in runs)
    agent_ms = median(r["agent_cpu_ms_per_request"] for r in runs)
    up = median(r["tunnel_bytes_up_per_request"] for r in runs)
    down = median(r["tunnel_bytes_down_per_request"] for r in runs)
    rss = median(r["agent"]["rss"] for r in runs)
    out += [
        "",
        f"CPU per relayed request (the two requests above, alternating, {runs[0]['cpu_requests']:,} per run, the"
        f" process's idle rate taken off): **hub {hub_ms:.3f} ms**, agent {agent_ms:.3f} ms; the hub relayed"
        f" {whole(up)} bytes up and {whole(down)} down per request (TLS records). TLS connections the agent"
        f" opened per run: {whole(median(r['tls_connections'] for r in runs))} (kept alive and reused).",
        "",
        "Where the added time goes (a py-spy profile of the agent in this series' CPU phase, 2026-11-29, summarised in",
        "[`bench/profile-agent-nodeapi.txt`](bench/profile-agent-nodeapi.txt)): the request's own path - the",
        "endpoint's HTTP serving, h11 and TLS over the tunnel, the session's websocket frames (trio-websocket) -",
        "and, beside it, the cache feed: every answer is written to the cache in a worker thread behind it (a list",
        "of the node's Pods replaces their collection in one transaction, a Node is compared with its row), about a",
        "fifth of the agent's samples. Behind the answer, but on two cores it takes the interpreter from the next",
        "request. The added time depends on the load more than on the code: the same series at load 6.5 (2026-11-27)",
        "added 9.68 ms to a get and 15.45 ms to a list, each hop being a process waiting for a core. What would",
        "shorten it: feeding nothing for an answer identical to the last one fed for the same request (a kubelet",
        "gets its Node every 10 s, mostly unchanged), and a websocket framer in C on the edge.",
        "",
        "The agent at rest after serving (endpoint on, its relay connections kept, median of three readings"
        " a second apart):",
        "",
        *table(
            ("agent", "RSS MiB", "USS MiB", "PSS MiB", "goal"),
            [
                (
                    "nodeApi on, endpoint serving",
                    mib(rss),
                    mib(median(r["agent"]["uss"] for r in runs)),
                    mib(median(r["agent"]["pss"] for r in runs)),
                    f"{'met' if rss / (1 << 20) < MEMORY_GOAL_MIB else 'NOT met'}: RSS < {MEMORY_GOAL_MIB:g} MiB",
                )
            ],
        ),
        "",
    ]
    return out


def relay_section(res: dict[str, Any]) -> list[str]:
    """N nodes' steady kubelet traffic as tunnels through one hub, simulated at the protocol level."""
    runs: list[dict[str, Any]] = res["runs"]
    out = [
        "## 6. One hub relaying N nodes' steady kubelet traffic (simulated at the protocol level)",
        "",
        f"*Measured {res['measured']}* (`bench/relay_load.py`). **Simulated**: the nodes are light clients",
        "(`bench/tunnel_fleet.py`) speaking the session protocol to ONE real hub (Hello with `tunnel.v1`,",
        "TunnelOpen, binary data frames, credit, pings); the hub's kubeconfig names a stand-in",
        "(`bench/api_standin.py`) that passes the hub's own TLS to the real API server (sessions are",
        "authenticated and marked on their Nodes as usual) and answers the tunnels itself. No TLS inside the",
        "tunnels (the hub relays ciphertext unread: only the sizes matter to it). Each node holds one request",
        f"tunnel and the table's watch tunnels open; it renews its lease every 10 s ({res['lease_bytes']}",
        f"bytes up, an answer of {res['lease_answer_bytes']}), updates its node status every 60 s (5x the",
        "kubelet's default report period) and gets a bookmark a minute on each watch. Hub CPU over a",
        f"{res['steady_s']:.0f} s steady window as a share of one core; round trips as the clients saw them.",
        "",
    ]  # fmt: skip
    if not runs:
        return [*out, "No run completed.", ""]
    rows = []
    for nodes, watches in sorted({(r["nodes"], r["watches"]) for r in runs}):
        of = [r for r in runs if (r["nodes"], r["watches"]) == (nodes, watches)]
        share = median(r["hub_cpu_share"] for r in of)
        verdict = f"{'met' if share < SHARE_GOAL else 'NOT met'}" if nodes >= 10_000 else ""
        rows.append(
            (
                whole(nodes), str(watches), whole(median(r["tunnels"] for r in of)),
                f"{median(r['requests_per_s'] for r in of):.0f}",
                f"**{share * 100:.1f}%**" + (f" ({verdict}: < 1 core)" if verdict else ""),
                f"{median(r['fleet_cpu_share'] for r in of) * 100:.0f}%",
                f"{median(r['standin_cpu_share'] for r in of) * 100:.0f}%",
                f"{median(r['median_ms'] for r in of):.1f} / {median(r['p99_ms'] for r in of):.1f}",
                mib(median(r["hub_rss"] for r in of)), f"{median(r['ready_s'] for r in of):.0f}",
                f"{len(of)} ({load_at_end(of)})",
            )
        )  # fmt: skip
    header = (
        "nodes", "watches per node", "tunnels", "requests/s", "hub CPU (of a core)", "clients' CPU", "stand-in CPU",
        "round trip median / p99 ms", "hub RSS MiB", "tunnels open after s", "runs (load)",
    )  # fmt: skip
    out += [*table(header, rows), ""]
    refused = [r for r in runs if r.get("refused")]
    for r in refused:
        out.append(
            f"While {whole(r['nodes'])} nodes opened their tunnels the hub could not connect {whole(r['refused'])}"
            f" to the API server (each asked again by the client): {'; '.join(sorted(set(r['refused_first'])))}."
        )
    return [*out, ""] if refused else out
