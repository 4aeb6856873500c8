"""The report's kubelet upgrade row (issue 26): one real node's kubelet swapped by a NodeUpgradeJob, how long from
dispatch to Ready, and whether the node's pod kept answering."""

from __future__ import annotations

from typing import Any

from bench.report.cells import load_at_end, median, table


def upgrade_section(res: dict[str, Any]) -> list[str]:
    """Created, dispatched, Ready and Completed per run, and the pod's answers meanwhile."""
    runs: list[dict[str, Any]] = res["runs"]
    out = [
        "## 7. A kubelet upgrade on a real node",
        "",
        f"*Measured {res['measured']}* (`bench/kubelet_upgrade.py`). The processes of",
        "`tests/integration/test_kubelet_upgrade.py`: a controller, a hub relaying the device's API requests, the",
        "agent (`nodeApi` and its `kubelet` block on), the node's containerd and its kubelet under the device's",
        "supervisor, one web pod on it; a registry holding the base kubelet (v1.20.2) and the next build of the same",
        "source (v1.20.3-nodetaskd.1), 100+ MB each. Each run a NodeUpgradeJob (`component: kubelet`,",
        "`allowDowngrade`) swaps the node's kubelet for the one it does not run: fetch and digest check, backup,",
        "swap, restart under the supervisor, healthz, then the Node Ready at the new version. Meanwhile a client",
        f"asks the pod's web server for its page {res['rate_per_s']} times a second, a new connection each time,",
        f"{res['request_limit_s']:g} s deadline. Times are seconds after the job's creation (the job and the Node",
        "polled as admin every 0.1 s); dispatched = the node's first phase after Pending; the actions' ends as the",
        "status stamps them (whole seconds of the agent's clock, the creation's fraction taken off).",
        "",
    ]
    if not runs:
        return [*out, "No run completed.", ""]
    rows = [
        (
            r["target"], f"{r['dispatched_s']:.1f}", f"{r['ready_s'] - r['dispatched_s']:.1f}",
            f"{r['completed_s']:.1f}", _flow(r.get("flow", [])), f"{r['failed']} of {r['answered'] + r['failed']}",
            f"{r['longest_gap_s']:.2f}", f"{r['load']:.1f}",
        )
        for r in runs
    ]  # fmt: skip
    header = (
        "to kubelet", "dispatched", "dispatch to Ready", "Completed", "actions ended at", "failed requests",
        "longest gap s", "load",
    )  # fmt: skip
    failed = sum(r["failed"] for r in runs)
    asked = sum(r["answered"] + r["failed"] for r in runs)
    to_ready = median(r["ready_s"] - r["dispatched_s"] for r in runs)
    verdict = "met" if failed == 0 else "NOT met"
    return [
        *out,
        *table(header, rows),
        "",
        f"Median over {len(runs)} runs: **dispatch to Ready {to_ready:.1f} s**, job created to Completed"
        f" {median(r['completed_s'] for r in runs):.1f} s; **{failed} of {asked:,} requests failed** ({verdict}:"
        f" zero failed at {res['rate_per_s']} per second), the longest time between two answers"
        f" {max(r['longest_gap_s'] for r in runs):.2f} s (0.1 s when none was missed). Load average at the end"
        f" {load_at_end(runs)}. The pod's container runs on through the kubelet's restart (containerd holds it),",
        "so the question is only whether anything on the node's path stops it answering.",
        "Until 2026-11-29 every start of these kubelets waited 5 s for a Docker this machine does not have",
        "(cAdvisor asks for its root five times a second apart; `tools/provision/docker_info.py` answers now):",
        "7.9 s median to Ready then. A real device with kubelet 1.20 and no Docker still waits those 5 s.",
        "",
    ]


def _flow(flow: list[tuple[str, float]]) -> str:
    return ", ".join(f"{action} {max(at, 0.0):.0f}" for action, at in flow)
