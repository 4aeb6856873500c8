"""The machine the provisioning scripts run on: its Debian packages, files written whole, locks, commands.

Shared by ``tools/provision/controlplane.py`` (and its sibling modules), ``containerd.py``, ``image.py``
and ``node.py``. Standard library only: these scripts run before (or without) the project's virtualenv.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[2]


class ControlPlaneError(RuntimeError):
    """Anything that prevents a usable control plane (or a node, or a build); the message is one line
    (plus, for start-up failures, the tail of the relevant log). Named for the first of the scripts; the
    others catch it under this name."""


def log(message: str, *, prefix: str = "controlplane") -> None:
    print(f"[{prefix}] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where built binaries live: ``$NODETASKD_CACHE`` or ``~/.cache/nodetaskd``.

    Outside the repository so that ``git clean`` does not cost a rebuild and
    the 100+ MB binaries never end up in a commit."""
    env = os.environ.get("NODETASKD_CACHE")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "nodetaskd"


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write via a temp file in the same directory + rename, so readers never
    see a half-written kubeconfig, token file or state record."""
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def install_atomic(source: Path, target: Path, mode: int = 0o755) -> None:
    """Copy ``source`` to ``target`` through a temp file + rename: a cached binary is whole or absent."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def which(name: str) -> Path | None:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    return Path(found) if found else None


def dpkg_installed(package: str) -> bool:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0 and result.stdout.strip().endswith(" installed")


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


@functools.cache
def _apt_update() -> None:
    """``apt-get update``, at most once per process (cached)."""
    log("apt-get update")
    run_quiet(["apt-get", "update", "-qq"], env=_apt_env(), what="apt-get update")


def apt_install(packages: Sequence[str]) -> None:
    """Install Debian packages (``apt-get update`` once per process first)."""
    if not packages:
        return
    if os.geteuid() != 0:
        raise ControlPlaneError(
            f"missing Debian packages {' '.join(packages)}; run as root or `sudo apt-get install {' '.join(packages)}`"
        )
    _apt_update()
    log(f"apt-get install {' '.join(packages)}")
    run_quiet(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        env=_apt_env(),
        what=f"apt-get install {' '.join(packages)}",
    )


def ensure_executables(wanted: Mapping[str, str]) -> dict[str, Path]:
    """The executables of ``wanted`` (executable -> Debian package providing it), installing the packages of
    missing ones under the cache's apt lock (two apt-get runs at once fail on dpkg's own lock).

    Checked by executable, not by package: e.g. kubectl may come from another vendor's package, and
    installing Debian's over it would be a file conflict."""
    if any(which(exe) is None for exe in wanted):
        cache = cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        with file_lock(cache / "apt.lock"):
            apt_install(sorted({pkg for exe, pkg in wanted.items() if which(exe) is None}))
    found = {exe: which(exe) for exe in wanted}
    absent = sorted(exe for exe, path in found.items() if path is None)
    if absent:
        raise ControlPlaneError(f"still not on PATH after installing packages: {', '.join(absent)}")
    return {exe: path for exe, path in found.items() if path is not None}


def run_quiet(
    argv: Sequence[str],
    *,
    what: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run a command, capturing output; on failure raise with its last line."""
    result = subprocess.run(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
        last = lines[-1] if lines else "(no output)"
        raise ControlPlaneError(f"{what} failed (exit {result.returncode}): {last}")
    return result.stdout


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive flock; says so on stderr when it has to wait for another process."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process holding {path} (probably building or installing)")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = [
    "REPO_ROOT",
    "ControlPlaneError",
    "apt_install",
    "cache_dir",
    "dpkg_installed",
    "ensure_executables",
    "file_lock",
    "install_atomic",
    "log",
    "run_quiet",
    "which",
    "write_atomic",
]
