"""``just demo``: nodetaskd doing its job for real on this machine, from an empty state to a summary.

What runs, all on loopback and all owned by this process:

- a kube-apiserver + etcd (``tools/provision/controlplane.py``; the first run on a machine builds kube-apiserver,
  which takes minutes and shows its progress), with the CRDs and RBAC applied, and N edge Nodes
  registered as a kubelet would (labelled ``node-role.kubernetes.io/edge``, Ready) with their tokens;
- a containerd and a registry seeded with the sample jobs' images (``tools/provision/containerd.py``) when they
  can run here; otherwise the demo says so and the edges run without a container runtime; the registry
  also gets the controller's and hubs' image, built without a container engine (``tools/provision/image.py``),
  and its digest is printed;
- ``nodetaskd --role=controller`` (admission webhooks registered), two ``--role=cloud`` hubs over TLS,
  and N ``--role=edge`` agents split across the hubs, each with its own config, token and store. The
  hubs bind port 0 and write the ports they got to their ``portsFile``; the edges are configured with
  those, so no port is chosen ahead of its bind.

Then the sample jobs in ``containers/samples`` are applied and followed live until every job ends
(or the time limit). The tolerant pre-pull fails on the node whose disk check cannot pass; the demo
then frees that node's disk threshold with a ConfigUpdateJob and retries the pre-pull (the
``nodetask.kubeedge.io/retry`` annotation), which runs again on that node only. Then the sample
diagnosis runs over every edge (``tools/demo/diagnosis.py``: its first path fails on some nodes,
whose app refuses connections, and its second succeeds). Then one edge, whose Node asks for
autonomy, is cut off from its hub, and the demo's kubectl still reads that device's local API
(``tools/demo/autonomy.py``); then the hub is started again on its ports, and the edge reconnects and
relists its cache, a change made meanwhile in the cloud included. Then two devices run as real nodes
(a kubelet and containerd each, behind their agents; :mod:`tools.demo.devices`, started beside the
jobs): one's kubelet is upgraded by a NodeUpgradeJob after a canary confirmation
(:mod:`tools.demo.kubelet_scene`), then both go through an outage of every hub
(:mod:`tools.demo.devices_scene`). A summary says what happened and
why, each retried node's two attempts, the diagnosis's paths, the cut-off edge's return, each Node's
Autonomy condition and label and each hub's state included, and everything is stopped again - on
Ctrl-C too. Whatever is not built yet in nodetaskd shows up as the reason the nodes report, never
hidden. The state directory (default ``~/.cache/nodetaskd/demo``) keeps configs and logs until the
next run wipes it.

The run's state is :mod:`tools.demo.state`; its steps are in :mod:`tools.demo.bringup` (everything
started), :mod:`tools.demo.jobs_scene`, :mod:`tools.demo.diagnosis_scene` and
:mod:`tools.demo.autonomy_scene` (what it shows) and :mod:`tools.demo.summary` (the end).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Final

from rich.console import Console

from tools.demo import autonomy_scene, bringup, devices_scene, diagnosis_scene, jobs_scene, kubelet_scene, summary
from tools.demo.fleet import Layout
from tools.demo.kube import ApiFailure
from tools.demo.procs import STOP_SIGNALS, Supervisor, kill_recorded
from tools.demo.state import Demo, DemoError
from tools.provision import controlplane as _cp

MARKER_FILE: Final = ".nodetaskd-demo"
"""Marks a directory as the demo's, so that only such a directory is ever wiped."""
HUB_NAMES: Final = ("hub-a", "hub-b")


def default_state_dir() -> Path:
    env = os.environ.get("NODETASKD_DEMO_DIR")
    return Path(env).expanduser().resolve() if env else _cp.cache_dir() / "demo"


@contextlib.contextmanager
def exclusive(root: Path) -> Iterator[None]:
    """Hold ``<root>.lock``: two demos on one state directory would wipe each other's files."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DemoError(f"another demo is running from {root}") from None
        yield


def fresh_state_dir(layout: Layout) -> list[str]:
    """Empty the state directory (only a demo's), stopping leftovers of a killed run first."""
    root = layout.root
    leftovers: list[str] = []
    if root.exists():
        if any(root.iterdir()) and not (root / MARKER_FILE).exists():
            raise DemoError(f"refusing to wipe {root}: it is not a demo state directory (no {MARKER_FILE})")
        leftovers = kill_recorded(layout.record, str(root))
        shutil.rmtree(root)
    for directory in (root, layout.logs, layout.config):
        directory.mkdir(parents=True, exist_ok=True)
    (root / MARKER_FILE).write_text("state of `just demo`; wiped by the next run\n")
    return leftovers


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="just demo", description="Run nodetaskd for real on this machine, then stop it all."
    )
    p.add_argument("--nodes", type=int, default=12, help="edge nodes (and edge processes) to run; at least 4")
    p.add_argument("--state-dir", type=Path, help="where configs, logs and cluster state go (wiped at start)")
    p.add_argument("--timeout", type=float, default=300, help="seconds the jobs may take before the summary")
    p.add_argument(
        "--diagnosis-timeout", type=float, default=120, help="seconds the diagnosis may take before the summary"
    )
    p.add_argument("--no-runtime", action="store_true", help="do not start containerd and the registry")
    p.add_argument("--no-linger", action="store_true", help="stop right after the summary")
    p.add_argument("--summary-json", type=Path, help="also write the end state of the jobs to this file")
    return p


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run(demo: Demo) -> None:
    """The demo's steps, in order; raises on anything that stops it."""
    api = demo.api = bringup.provision_cluster(demo)
    cri_endpoint = bringup.provision_runtime(demo, jobs_scene.sample_repositories())
    bringup.publish_upgrade(demo)
    bringup.publish_image(demo)
    bringup.start_control(demo, HUB_NAMES)
    # The edges are configured with the ports the hubs reported.
    tokens = bringup.register_fleet(demo, api)
    bringup.start_edges(demo, tokens, cri_endpoint)
    bringup.start_devices(demo, cri_endpoint)
    registry = f"{demo.runtime.registry.host}/" if demo.runtime else jobs_scene.NO_REGISTRY
    jobs_scene.apply_jobs(demo, registry)
    demo.say(f"follow along: export KUBECONFIG={demo.layout.cluster / 'admin.kubeconfig'}; kubectl get nodejobs -w")
    jobs_scene.follow(demo)
    jobs_scene.retry_tolerant(demo)
    diagnosis_scene.diagnose(demo)
    autonomy_scene.cut_off_edge(demo)
    kubelet_scene.upgrade_kubelet(demo)
    devices_scene.go_offline(demo)
    summary.summarize(demo)
    summary.linger(demo)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.nodes < 4:
        print("just demo: --nodes must be at least 4 (two canaries and a main ring of two or more)", file=sys.stderr)
        return 2
    root = (args.state_dir or default_state_dir()).expanduser().resolve()
    console = Console(highlight=False)
    if not console.is_terminal:
        # Logs and CI: no terminal to fit, so do not squeeze the tables into 80 columns.
        console = Console(highlight=False, width=140)
    layout = Layout(root)
    # SIGINT too: a shell starting the demo in the background hands it SIGINT ignored, and Ctrl-C
    # (or kill -INT) must still stop everything.
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
    status = 1
    demo: Demo | None = None
    try:
        with exclusive(root):
            leftovers = fresh_state_dir(layout)
            for line in leftovers:
                console.print(f"stopped a leftover of an earlier run: {line}", style="yellow")
            demo = Demo(args=args, console=console, layout=layout, procs=Supervisor(marker=str(root)))
            demo.say(f"nodetaskd demo: {args.nodes} edges, 2 hubs, 1 controller; state and logs in {root}")
            try:
                run(demo)
                status = 0
            except KeyboardInterrupt:
                console.print("\ninterrupted: stopping everything", style="bold yellow")
                status = 130
            except (DemoError, ApiFailure, _cp.ControlPlaneError) as exc:
                console.print(f"demo failed: {exc}", style="bold red", highlight=False)
            finally:
                # A second Ctrl-C must not cut the tear-down short and leave processes behind.
                for signum in STOP_SIGNALS:
                    signal.signal(signum, signal.SIG_IGN)
                left = demo.stop()
            if left:
                console.print("processes left behind:\n  " + "\n  ".join(left), style="bold red")
                status = status or 1
            else:
                demo.say(f"stopped: no process of the demo is left (logs and configs kept in {root})")
    except DemoError as exc:
        console.print(f"demo failed: {exc}", style="bold red", highlight=False)
    except KeyboardInterrupt:
        # Before anything was started (while wiping the previous run's state).
        status = 130
    if args.summary_json and demo is not None:
        summary.write_summary(args.summary_json, demo, status)
    return status


if __name__ == "__main__":
    sys.exit(main())
