"""The demo's first scene: the sample jobs applied and followed live, the tolerant pre-pull's failing node's
disk threshold freed by a ConfigUpdateJob, and that pre-pull retried on it alone."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec
from rich.live import Live

from schemas.core import RETRY_ANNOTATION
from tools.demo.confirm import AFTER, Confirmer
from tools.demo.kube import JobView, list_jobs, recent_events
from tools.demo.state import EVENTS_SHOWN, POLL_SECONDS, SAMPLES_DIR, Demo
from tools.demo.view import live_view

SAMPLES: Final = (
    "imageprepulljob.yaml",
    "configupdatejob.yaml",
    "nodeupgradejob.yaml",
    "imageprepulljob-tolerant.yaml",
)
TOLERANT: Final = "prepull-tolerant"
"""The sample the demo retries once its failing node's disk threshold is freed."""
RETRY_VALUE: Final = "disk-threshold-freed"
FREED_DISK_USAGE: Final = "100"
"""maxDiskUsage the ConfigUpdateJob gives the full-disk node: no disk is more than 100% used."""
REGISTRY_PLACEHOLDER: Final = "REGISTRY/"
NO_REGISTRY: Final = "registry.invalid/"
"""Where images point when no registry runs (``.invalid`` never resolves; nothing pulls them anyway)."""


def apply_jobs(demo: Demo, registry: str) -> None:
    """Apply the samples with one kubectl call (through the admission webhooks, as a user would)."""
    assert demo.cp is not None
    manifests = [render_sample(SAMPLES_DIR / name, registry=registry) for name in SAMPLES]
    demo.job_names = [m["metadata"]["name"] for m in manifests]
    for m in manifests:
        if m["kind"] == "ConfigUpdateJob":
            demo.updated_settings[m["metadata"]["name"]] = sorted(m["spec"]["updateFields"])
    listing = {"apiVersion": "v1", "kind": "List", "items": manifests}
    out = demo.cp.kubectl("apply", "-f", "-", input=json.dumps(listing)).stdout.split("\n")
    demo.say(f"kubectl apply -f containers/samples/ ({', '.join(SAMPLES)}):")
    for line in filter(None, out):
        demo.say(f"  {line}")


def follow(demo: Demo, until: Callable[[list[JobView]], bool] | None = None) -> None:
    """Show the jobs live until ``until`` holds (default: every sample has ended) or the time limit passes."""
    assert demo.api is not None
    api = demo.api
    deadline = time.monotonic() + demo.args.timeout
    phases: dict[str, str] = {job.name: job.phase for job in demo.jobs}
    assert demo.cp is not None
    if demo.confirmer is None:
        demo.confirmer = Confirmer(cp=demo.cp, procs=demo.procs, layout=demo.layout, say=demo.say)
    confirmer = demo.confirmer
    done = until or (lambda jobs: len(jobs) >= len(SAMPLES) and all(j.ended for j in jobs))
    help_text = f"The demo releases each after {AFTER:.0f}s: one from the cloud, one on the device."
    # Transient: the summary, printed next, replaces the last frame.
    with Live(console=demo.console, auto_refresh=False, transient=True) as live:
        while True:
            order = {name: i for i, name in enumerate(demo.job_names)}
            jobs = sorted(list_jobs(api), key=lambda j: order.get(j.name, len(order)))
            events = recent_events(api, EVENTS_SHOWN)
            demo.jobs = jobs
            for job in jobs:
                if phases.get(job.name, "") != job.phase:
                    before = phases.get(job.name) or "(new)"
                    phases[job.name] = job.phase
                    demo.say(f"{job.name}: {before} -> {job.phase or '(new)'}")
            for job in jobs:
                confirmer.release(job)
            confirmer.report()
            for child in demo.procs.dead():
                # Only a role process ends here: confirmations were reported (and removed) above.
                demo.say(f"{child.name} exited with status {child.popen.returncode} (log {child.log})", "red")
                demo.procs.children.remove(child)
            elapsed = time.monotonic() - demo.started
            header = f"{demo.runtime_line()}   elapsed {elapsed:.0f}s, limit {demo.args.timeout:.0f}s for the jobs"
            live.update(live_view(jobs, events, header=header, confirmation_help=help_text), refresh=True)
            if done(jobs):
                break
            if time.monotonic() >= deadline:
                demo.unfinished = [j.name for j in jobs if not j.ended]
                demo.say(f"time limit reached; not finished: {', '.join(demo.unfinished)}", "bold yellow")
                break
            time.sleep(POLL_SECONDS)
    confirmer.finish()


def retry_tolerant(demo: Demo) -> None:
    """Free the full-disk node's threshold with a ConfigUpdateJob, then retry the tolerant pre-pull."""
    assert demo.cp is not None
    if demo.unfinished:
        demo.say(f"not retrying {TOLERANT}: the jobs did not all finish", "yellow")
        return
    full = next(e.name for e in demo.edges if e.full_disk)
    tolerant = next((j for j in demo.jobs if j.name == TOLERANT), None)
    failed = [n.name for n in tolerant.nodes if n.phase in ("Failure", "Unknown")] if tolerant else []
    if not failed:
        demo.say(f"not retrying {TOLERANT}: none of its nodes failed", "yellow")
        return
    update = free_disk_job(full)
    name = update["metadata"]["name"]
    demo.job_names.append(name)
    demo.updated_settings[name] = sorted(update["spec"]["updateFields"])
    demo.cp.kubectl("apply", "-f", "-", input=json.dumps(update))
    demo.say(
        f"{TOLERANT} failed on {', '.join(failed)}: freeing {full}'s disk threshold with ConfigUpdateJob "
        f"{name} (maxDiskUsage {FREED_DISK_USAGE}), then retrying the pre-pull"
    )
    follow(demo, until=lambda jobs: any(j.name == name and j.ended for j in jobs))
    if demo.unfinished:
        return
    args = ("annotate", "--overwrite", "imageprepulljob", TOLERANT, f"{RETRY_ANNOTATION}={RETRY_VALUE}")
    demo.cp.kubectl(*args)
    demo.say(f"kubectl {' '.join(args)}")
    follow(demo, until=lambda jobs: any(j.name == TOLERANT and j.run > 1 and j.ended for j in jobs))


def free_disk_job(node: str) -> dict[str, Any]:
    """The ConfigUpdateJob that lifts ``node``'s disk-usage ceiling, so that its disk check passes."""
    return {
        "apiVersion": "operations.kubeedge.io/v1alpha2",
        "kind": "ConfigUpdateJob",
        "metadata": {"name": f"free-disk-{node}"},
        "spec": {"nodeNames": [node], "updateFields": {"maxDiskUsage": FREED_DISK_USAGE}, "timeoutSeconds": 120},
    }


def render_sample(path: Path, *, registry: str) -> dict[str, Any]:
    """The sample manifest with its images pointed at ``registry``."""
    manifest: dict[str, Any] = msgspec.yaml.decode(path.read_bytes())
    spec = manifest["spec"]
    template = spec.get("imagePrePullTemplate")
    if template is not None:
        template["images"] = [i.replace(REGISTRY_PLACEHOLDER, registry, 1) for i in template["images"]]
    if isinstance(spec.get("image"), str):
        spec["image"] = spec["image"].replace(REGISTRY_PLACEHOLDER, registry, 1)
    return manifest


def sample_repositories() -> list[str]:
    """``name:tag`` of every image the samples pull from the demo registry."""
    found: dict[str, None] = {}
    for name in SAMPLES:
        manifest = msgspec.yaml.decode((SAMPLES_DIR / name).read_bytes())
        template = manifest["spec"].get("imagePrePullTemplate") or {}
        for image in template.get("images", ()):
            if image.startswith(REGISTRY_PLACEHOLDER):
                found[image.removeprefix(REGISTRY_PLACEHOLDER)] = None
    return list(found)
