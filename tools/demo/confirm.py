"""The demo's hand on the confirmation gate: nodes paused at WaitingConfirmation are released, visibly.

Both ways nodetaskd offers are shown, alternately: from the cloud, the job's confirm annotation
names the node (the hub then sends Confirm); on the device, ``nodetaskd --role=edge --confirm JOB``
talks to the running agent's control socket, as an operator at the device would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from schemas.core import CONFIRM_ANNOTATION
from tools.demo.fleet import Layout
from tools.demo.kube import JobView
from tools.demo.procs import Supervisor
from tools.demo.view import paused_for_confirmation
from tools.processes import role_command
from tools.provision import controlplane as _cp

PREFIX: Final = "confirm-"
"""Name prefix of the short-lived ``nodetaskd --confirm`` processes among the demo's children."""
AFTER: Final = 3.0
"""Seconds a node stays paused, visibly, before the demo releases it."""
ANSWER_WAIT: Final = 15.0
"""Longest the demo waits, at the end, for a device confirmation still starting up."""


@dataclass
class Confirmer:
    cp: _cp.ControlPlane
    procs: Supervisor
    layout: Layout
    say: Callable[[str, str], None]
    paused_since: dict[tuple[str, str], float] = field(default_factory=dict)
    released: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per job, the nodes released and how: ``cloud`` or ``device``."""

    def release(self, job: JobView) -> None:
        """Release the nodes of ``job`` paused for :data:`AFTER` seconds, alternating the two ways."""
        now = time.monotonic()
        released = self.released.setdefault(job.name, {})
        for node in paused_for_confirmation(job):
            seen = self.paused_since.setdefault((job.name, node), now)
            if node in released or now - seen < AFTER:
                continue
            if len(released) % 2 == 0:
                released[node] = "cloud"
                self._from_cloud(job, sorted(n for n, way in released.items() if way == "cloud"))
            else:
                released[node] = "device"
                self._on_device(job, node)

    def _from_cloud(self, job: JobView, nodes: list[str]) -> None:
        args = ("annotate", "--overwrite", job.kind.lower(), job.name, f"{CONFIRM_ANNOTATION}={','.join(nodes)}")
        result = self.cp.kubectl(*args, check=False)
        answer = " ".join((result.stdout + result.stderr).split())
        self.say(f"confirming {nodes[-1]} from the cloud: kubectl {' '.join(args)} -> {answer}", "cyan")

    def _on_device(self, job: JobView, node: str) -> None:
        # In the background: a new interpreter takes seconds to start, and the live view goes on.
        config = self.layout.edge(node) / "edge.yaml"
        self.say(
            f"confirming {node} on the device: "
            f"nodetaskd --role=edge --config=.../{node}/edge.yaml --confirm={job.name}",
            "cyan",
        )
        name = f"{PREFIX}{node}"
        self.procs.start(name, [*role_command("edge", config), f"--confirm={job.name}"], log=self.layout.log(name))

    def report(self) -> None:
        """Print the answers of the device confirmations that have ended, and forget those processes."""
        for child in [c for c in self.procs.dead() if c.name.startswith(PREFIX)]:
            self.procs.children.remove(child)
            answer = " ".join(child.log.read_text(errors="replace").split()) or "(no output)"
            style = "cyan" if child.popen.returncode == 0 else "red"
            self.say(
                f"{child.name.removeprefix(PREFIX)} on the device answered: {answer} (exit {child.popen.returncode})",
                style,
            )

    def finish(self) -> None:
        """Wait (bounded) for device confirmations still running, report them, stop any left."""
        pending = [c for c in self.procs.children if c.name.startswith(PREFIX)]
        deadline = time.monotonic() + ANSWER_WAIT
        while any(c.alive() for c in pending) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.report()
        self.procs.stop(c.name for c in pending)

    def how(self, job: str) -> str:
        """How the nodes of ``job`` were released, as a sentence fragment; empty if none was."""
        ways = {"cloud": "from the cloud (job annotation)", "device": "on the device (--confirm)"}
        return ", ".join(f"{node} {ways[way]}" for node, way in self.released.get(job, {}).items())
