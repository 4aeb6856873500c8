"""One run of the demo: what it started (so that :meth:`Demo.stop` stops exactly that) and what it saw,
and what every step does with it (say what happens, wait for something, record what to stop)."""

from __future__ import annotations

import argparse
import contextlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from rich.console import Console

from roles.common.tls import ServingCertificate
from tools.demo import autonomy
from tools.demo import diagnosis as diag
from tools.demo.confirm import Confirmer
from tools.demo.devices import Devices
from tools.demo.fleet import Edge, Hub, HubState, Layout
from tools.demo.heartbeat import Heartbeat
from tools.demo.kube import Api, ApiFailure, JobView
from tools.demo.procs import Supervisor, write_record
from tools.demo.runtime import Runtime
from tools.processes import processes_in_sessions
from tools.provision import controlplane as _cp

SAMPLES_DIR: Final = _cp.REPO_ROOT / "containers" / "samples"
"""The sample manifests the scenes apply."""
EVENTS_SHOWN: Final = 6
"""Recent Events in the live view and the summary."""
POLL_SECONDS: Final = 1.0
"""How often a scene reads what it follows."""


class DemoError(RuntimeError):
    """The demo cannot go on; the message says what failed and where its log is."""


@dataclass
class Demo:
    """One run: what it started (so that :meth:`stop` can stop exactly that) and what it saw."""

    args: argparse.Namespace
    console: Console
    layout: Layout
    procs: Supervisor
    cp: _cp.ControlPlane | None = None
    runtime: Runtime | None = None
    runtime_problem: str = ""
    api: Api | None = None
    hubs: list[Hub] = field(default_factory=list)
    """The hubs started, with the ports each reported it bound."""
    hub_starts: dict[str, int] = field(default_factory=dict)
    hub_cert: ServingCertificate | None = None
    edges: list[Edge] = field(default_factory=list)
    heartbeat: Heartbeat | None = None
    """Renews the agent-only edges' Leases (:mod:`tools.demo.heartbeat`) from their registration on."""
    job_names: list[str] = field(default_factory=list)
    updated_settings: dict[str, list[str]] = field(default_factory=dict)
    """Per ConfigUpdateJob, the edge settings it sets (read back from the edges' files in the summary)."""
    jobs: list[JobView] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    confirmer: Confirmer | None = None
    directory: diag.Directory | None = None
    diagnosis: diag.DiagnosisView | None = None
    cut_off: autonomy.AutonomyView | None = None
    """What the autonomy step showed (:func:`tools.demo.autonomy_scene.cut_off_edge`)."""
    nodes_autonomy: list[autonomy.NodeAutonomy] = field(default_factory=list)
    """Every Node's Autonomy condition and label, as the summary read them."""
    hub_states: list[HubState] = field(default_factory=list)
    """Every hub as the summary found it."""
    devices: Devices | None = None
    """The real nodes (:mod:`tools.demo.devices`), once their bring-up started."""
    started: float = field(default_factory=time.monotonic)

    def say(self, message: str, style: str = "") -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(f"[dim]{elapsed:6.1f}s[/dim] {message}", style=style, highlight=False)

    def record(self) -> None:
        pids = [*(self.cp.pids.values() if self.cp else ()), *(self.runtime.pids if self.runtime else ())]
        write_record(self.layout.record, [*pids, *(c.pid for c in self.procs.children)])

    def hub_client(self) -> ssl.SSLContext:
        """A TLS client trusting the hubs' CA."""
        assert self.hub_cert is not None
        return ssl.create_default_context(cadata=self.hub_cert.ca_bundle.decode())

    def wait(self, what: str, ready: Callable[[], bool], *, limit: float, fatal: bool = True) -> bool:
        """Poll ``ready`` up to ``limit`` seconds, failing early if a process the demo started died."""
        deadline = time.monotonic() + limit
        with self.console.status(f"waiting for {what}"):
            while True:
                dead = self.procs.dead()
                if dead:
                    first = dead[0]
                    raise DemoError(
                        f"{first.name} exited with status {first.popen.returncode} while waiting for {what}; "
                        f"log {first.log}:\n{_cp._tail(first.log, 15)}"
                    )
                with contextlib.suppress(ApiFailure):
                    if ready():
                        return True
                if time.monotonic() >= deadline:
                    if fatal:
                        raise DemoError(f"gave up waiting for {what} after {limit:.0f}s; logs in {self.layout.logs}")
                    return False
                time.sleep(0.5)

    def runtime_line(self) -> str:
        if self.runtime is None:
            return "runtime: NONE (running without a container runtime)"
        return f"runtime: containerd {self.runtime.containerd.endpoint}, registry {self.runtime.registry.host}"

    def stop(self) -> list[str]:
        """Stop everything this run started, in reverse order; returns processes left behind (none)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.devices is not None:
            # The kubelets first: their pods would be restarted by nothing once the agents are gone.
            for problem in self.devices.stop():
                self.say(problem, "red")
        self.procs.stop()
        if self.directory is not None:
            self.directory.stop()
        if self.runtime is not None:
            for error in self.runtime.stop():
                self.say(error, "red")
        if self.cp is not None:
            try:
                self.cp.stop()
            except _cp.ControlPlaneError as exc:
                self.say(str(exc), "red")
        leaders = [
            *self.procs.started,
            *(self.cp.pids.values() if self.cp else ()),
            *(self.runtime.pids if self.runtime else ()),
        ]
        left = [f"pid {pid}: {cmd[:160]}" for pid, cmd in processes_in_sessions(leaders).items()]
        self.layout.record.unlink(missing_ok=True)
        return left
