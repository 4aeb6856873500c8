"""The demo's end: what the run showed, printed (the jobs, findings, the diagnosis, autonomy, the hubs, and
commands to look further), kept up for a person at the terminal, and written as JSON for the tests."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import select
import sys
from pathlib import Path
from typing import Final

import msgspec

from nodetask.autonomy import STATUS_LABEL
from tools.demo import autonomy
from tools.demo import diagnosis as diag
from tools.demo.bringup import answers_ok
from tools.demo.fleet import RING_LABEL, HubState
from tools.demo.jobs_scene import TOLERANT
from tools.demo.kube import ApiFailure, JobView, hubs_of_nodes, recent_events
from tools.demo.state import EVENTS_SHOWN, Demo
from tools.demo.view import (
    WAITING_CONFIRMATION,
    attempts,
    events_table,
    paused_for_confirmation,
    reasons,
    summary_table,
)

LINGER_LIMIT: Final = 900.0
"""Longest the demo waits, after its summary, for Enter before stopping by itself."""


def read_hubs(demo: Demo) -> list[HubState]:
    """Each hub's process, readiness and edges (by the Nodes' hub annotations), now."""
    held_by: dict[str, str] = {}
    if demo.api is not None:
        with contextlib.suppress(ApiFailure):
            held_by = hubs_of_nodes(demo.api)
    states = []
    for hub in demo.hubs:
        child = next((c for c in demo.procs.children if c.name == hub.name), None)
        running = child is not None and child.alive()
        states.append(
            HubState(
                name=hub.name,
                url=hub.url,
                http_port=hub.http_port,
                pid=child.pid if child is not None else 0,
                starts=demo.hub_starts.get(hub.name, 0),
                running=running,
                ready=running and answers_ok(hub.ready_url, demo.hub_client())(),
                edges=tuple(sorted(node for node, name in held_by.items() if name == hub.name)),
            )
        )
    return states


def summarize(demo: Demo) -> None:
    demo.console.print()
    if demo.api is not None:
        with contextlib.suppress(ApiFailure):
            demo.console.print(events_table(recent_events(demo.api, EVENTS_SHOWN)))
    demo.console.print(summary_table(demo.jobs, demo.unfinished))
    for line in findings(demo):
        demo.console.print(f"- {line}", highlight=False)
    if demo.diagnosis is not None:
        demo.console.print()
        down = demo.directory.down if demo.directory else ()
        for line in diag.summary_lines(demo.diagnosis, down=down):
            demo.console.print(line, highlight=False)
    if demo.api is not None:
        with contextlib.suppress(ApiFailure):
            demo.nodes_autonomy = autonomy.node_autonomy(demo.api)
        demo.console.print()
        for line in autonomy.summary_lines(demo.cut_off, demo.nodes_autonomy):
            demo.console.print(line, highlight=False, markup=False)
    if demo.devices is not None:
        demo.console.print()
        for line in demo.devices.view.lines():
            demo.console.print(line, highlight=False, markup=False)
    demo.hub_states = read_hubs(demo)
    if demo.hub_states:
        demo.console.print("\nhubs (each bound port 0 at its first start and reported the ports it got):")
        for hub in demo.hub_states:
            demo.console.print(f"  {hub.line()}", highlight=False)
    kubeconfig = demo.layout.cluster / "admin.kubeconfig"
    demo.console.print("\nTo look further (while the demo runs: in a terminal it waits for Enter here):", style="bold")
    for command in (
        f"export KUBECONFIG={kubeconfig}",
        "kubectl get nodejobs",
        f"kubectl get nodes -L {RING_LABEL} -L nodetask.kubeedge.io/hub",
        "kubectl get imageprepulljob prepull-all-edges -o yaml",
        f"kubectl get imageprepulljob {TOLERANT} -o yaml   # status.retry, nodeStatus[].previousAttempt",
        "kubectl describe nodeupgradejob upgrade-canaries",
        "kubectl get events -n default --sort-by=.lastTimestamp",
        "kubectl get diagnosis edge-health -o yaml; kubectl get tasks",
        f"kubectl get nodes -L {STATUS_LABEL}; kubectl describe node <node>   # the Autonomy condition",
        f"cat {demo.layout.ports('hub-a')}   # the ports hub-a bound (it started on port 0)",
        *(
            [f"kubectl --server=http://127.0.0.1:{demo.cut_off.port} get pods,configmaps -A   # the cut-off edge"]
            if demo.cut_off
            else []
        ),
    ):
        demo.console.print(f"  {command}", highlight=False)
    demo.console.print(f"Logs: {demo.layout.logs}/<controller|hub-a|hub-b|edge-NN>.log", highlight=False)


def findings(demo: Demo) -> list[str]:
    """Plain sentences about what the run showed, each read from the jobs, files or containerd."""
    out: list[str] = []
    if demo.runtime is None:
        out.append(f"Ran WITHOUT a container runtime ({demo.runtime_problem}).")
    else:
        pulled = demo.runtime.pulled()
        if pulled is not None:
            held = [i for i in demo.runtime.images if i in pulled]
            out.append(f"containerd holds {len(held)} of the {len(demo.runtime.images)} seeded images after the run.")
        if any("container runtime is not available" in r for job in demo.jobs for r in reasons(job)):
            out.append(
                "containerd was running, yet edges report no container runtime: this edge build does not "
                "pull through criEndpoint."
            )
    for job in demo.jobs:
        out.extend(_job_findings(demo, job))
    if demo.heartbeat is not None and demo.heartbeat.problem:
        out.append(f"Renewing the agent-only edges' Leases failed at least once: {demo.heartbeat.problem}")
    return out


def _job_findings(demo: Demo, job: JobView) -> list[str]:
    out: list[str] = []
    failed = job.counts.get("failure", 0) + job.counts.get("unknown", 0)
    if job.phase == "Completed" and failed:
        out.append(
            f"{job.name}: Completed with {failed} of {job.counts.get('total', 0)} nodes failed: "
            "within its failureTolerate."
        )
    paused = paused_for_confirmation(job)
    if paused:
        out.append(f"{job.name}: {', '.join(paused)} still waited for confirmation when the demo stopped.")
    if job.run > 1:
        out.append(f"{job.name}: retried, run {job.run} ended {job.phase}. " + " ".join(attempts(job)))
    how = demo.confirmer.how(job.name) if demo.confirmer else ""
    if how:
        out.append(f"{job.name}: paused at WaitingConfirmation; the demo released {how}.")
    timed_out = [n.name for n in job.nodes if n.phase == "Unknown" and n.last_action == WAITING_CONFIRMATION]
    if timed_out:
        out.append(f"{job.name}: {', '.join(timed_out)} timed out while waiting for confirmation.")
    if job.kind == "ConfigUpdateJob":
        updated = [n.name for n in job.nodes if n.phase == "Successful"]
        for setting in demo.updated_settings.get(job.name, ()):
            readings: dict[str, list[str]] = {}
            for name in updated:
                readings.setdefault(str(_edge_setting(demo, name, setting)), []).append(name)
            for value, names in readings.items():
                out.append(f"{job.name}: {setting} reads {value} in the edge.yaml of {_nodes(names)}.")
    return out


def _edge_setting(demo: Demo, node: str, key: str) -> object:
    try:
        config = msgspec.yaml.decode((demo.layout.edge(node) / "edge.yaml").read_bytes())
    except (OSError, msgspec.DecodeError):
        return "(unreadable)"
    return config.get(key, "(unset)") if isinstance(config, dict) else "(not a mapping)"


def linger(demo: Demo) -> None:
    """With a person at the terminal, keep everything up for the kubectl commands until Enter."""
    if demo.args.no_linger or not (sys.stdin.isatty() and demo.console.is_terminal):
        return
    demo.console.print(
        f"\nEverything is still running. Press Enter (or Ctrl-C) to stop it all; "
        f"it stops by itself after {LINGER_LIMIT / 60:.0f} minutes.",
        style="bold",
    )
    select.select([sys.stdin], [], [], LINGER_LIMIT)


def _nodes(names: list[str]) -> str:
    return f"all {len(names)} updated nodes" if len(names) > 3 else ", ".join(names)


def write_summary(path: Path, demo: Demo, status: int) -> None:
    """The end state as JSON at ``path`` (``--summary-json``): what the demo's test reads."""
    summary = {
        "status": status,
        "runtime": demo.runtime_line(),
        "runtimeProblem": demo.runtime_problem,
        "unfinished": demo.unfinished,
        "diagnosis": diag.as_json(demo.diagnosis),
        "autonomy": autonomy.as_json(demo.cut_off, demo.nodes_autonomy),
        "hubs": [dataclasses.asdict(hub) for hub in demo.hub_states],
        "devices": None if demo.devices is None else demo.devices.view.as_json(),
        "jobs": [
            {
                "kind": j.kind,
                "name": j.name,
                "phase": j.phase,
                "reason": j.reason,
                "counts": dict(j.counts),
                "run": j.run,
                "nodes": [
                    {
                        "name": n.name,
                        "phase": n.phase,
                        "reason": n.reason,
                        "lastAction": n.last_action,
                        "attempt": n.attempt,
                        "previousAttempt": None if n.previous is None else dataclasses.asdict(n.previous),
                    }
                    for n in j.nodes
                ],
            }
            for j in demo.jobs
        ],
    }
    path.write_text(json.dumps(summary, indent=2) + "\n")
