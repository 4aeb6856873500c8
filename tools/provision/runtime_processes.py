"""What the real containerd and registries of :mod:`tools.provision.containerd` share: the Debian tools they
run, installed when missing, and starting, watching and stopping their server processes. Stdlib only."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tools.provision import controlplane as _cp

READY_TIMEOUT: Final = 30.0

_PACKAGES: Final[Mapping[str, str]] = {
    # executable -> Debian package providing it
    "containerd": "containerd",
    "runc": "runc",
    "docker-registry": "docker-registry",
    "skopeo": "skopeo",
    "umoci": "umoci",
    "htpasswd": "apache2-utils",
}


class RuntimeServicesError(RuntimeError):
    """Anything that prevents a usable containerd or registry; the message says what and where."""


def log(message: str) -> None:
    print(f"[containerd] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Executables
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the executables this module runs."""

    containerd: Path
    registry: Path
    skopeo: Path
    umoci: Path
    htpasswd: Path


def ensure_tools() -> Tools:
    """Return the executables, installing the Debian packages that provide missing ones.

    A lock in the cache directory serialises concurrent callers, since two apt-get runs at once
    fail on dpkg's own lock.
    """
    missing = [pkg for exe, pkg in _PACKAGES.items() if _cp._which(exe) is None]
    if missing:
        cache = _cp.cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        with _cp._file_lock(cache / "apt.lock"):
            missing = [pkg for exe, pkg in _PACKAGES.items() if _cp._which(exe) is None]
            try:
                _cp._apt_install(missing)
            except _cp.ControlPlaneError as exc:
                raise RuntimeServicesError(str(exc)) from None
    found = {exe: _cp._which(exe) for exe in _PACKAGES}
    absent = sorted(exe for exe, path in found.items() if path is None)
    if absent:
        raise RuntimeServicesError(f"still not on PATH after installing packages: {', '.join(absent)}")

    def path(exe: str) -> Path:
        found_path = found[exe]
        assert found_path is not None
        return found_path

    return Tools(
        containerd=path("containerd"),
        registry=path("docker-registry"),
        skopeo=path("skopeo"),
        umoci=path("umoci"),
        htpasswd=path("htpasswd"),
    )


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------


@dataclass
class Process:
    """One started server: its PID, log and (when started by this process) its Popen."""

    name: str
    pid: int
    log: Path
    marker: str
    """A string in the server's command line (its config path), so a reused PID is never killed."""
    child: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        if self.child is not None:
            return self.child.poll() is None
        return _cp._pid_is_ours(self.pid, self.marker)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period. Idempotent."""
        try:
            _cp._terminate(self.pid, self.marker, self.child)
        except _cp.ControlPlaneError as exc:
            raise RuntimeServicesError(f"{self.name}: {exc}") from None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.child.returncode if self.child is not None else "?"
            raise RuntimeServicesError(
                f"{self.name} exited with status {code} during start-up; log {self.log}:\n{_cp._tail(self.log)}"
            )


def spawn(name: str, argv: Sequence[str], *, log: Path, marker: str, detach: bool) -> Process:
    """Start a server with its output in ``log``; unless detached it dies with this (main) thread."""
    with open(log, "ab") as out:
        out.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}\n".encode())
        out.flush()
        # PDEATHSIG fires when the *thread* that forked exits, so only the main thread may arm it.
        tie = not detach and threading.current_thread() is threading.main_thread()
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_cp._die_with_parent if tie else None,  # noqa: PLW1509 (only a prctl() runs)
        )
    return Process(name=name, pid=child.pid, log=log, marker=marker, child=child)


def wait_until(what: str, process: Process, ready: Callable[[], bool], timeout: float = READY_TIMEOUT) -> None:
    """Poll ``ready()`` until true; fail early if the process dies, with its log tail."""
    deadline = time.monotonic() + timeout
    while True:
        process.check_alive()
        if ready():
            return
        if time.monotonic() >= deadline:
            raise RuntimeServicesError(
                f"{what} not ready after {timeout:.0f}s; log {process.log}:\n{_cp._tail(process.log)}"
            )
        time.sleep(0.05)


def run(argv: Sequence[str], *, what: str, cwd: Path | None = None) -> str:
    result = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        detail = " ".join((result.stderr.strip() or result.stdout.strip()).split()[-40:]) or "(no output)"
        raise RuntimeServicesError(f"{what} failed (exit {result.returncode}): {detail}")
    return result.stdout


def prepare_dir(path: Path) -> Path:
    """Create ``path`` or accept it empty; refuse a populated directory (never delete anything)."""
    path = path.expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if any(path.iterdir()):
        raise RuntimeServicesError(f"refusing to use non-empty directory {path}")
    return path


__all__ = [
    "READY_TIMEOUT",
    "Process",
    "RuntimeServicesError",
    "Tools",
    "ensure_tools",
    "log",
    "prepare_dir",
    "run",
    "spawn",
    "wait_until",
]
