"""A small size-limited tmpfs that only one child process (and its children) sees: a full disk on demand.

The child runs in a user and mount namespace of its own (``unshare -rm``), so the tmpfs needs no
privilege and vanishes with it; the network namespace is the machine's, so the child still reaches
servers on loopback. From outside, the tmpfs is reached through ``/proc/<pid>/root``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest

MOUNT: Final = 'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"'
"""Mount a tmpfs on the directory ($0), then run the command."""


def on_tmpfs(directory: Path, size: int) -> tuple[str, ...]:
    """The command line that mounts a tmpfs of ``size`` bytes on ``directory`` and runs what follows it."""
    return ("unshare", "-rm", "sh", "-c", MOUNT.format(size=size), str(directory))


def seen_by(pid: int, path: Path) -> Path:
    """``path`` as the process ``pid`` sees it (inside its mount namespace)."""
    return Path(f"/proc/{pid}/root") / path.relative_to("/")


def usable(directory: Path) -> None:
    """Skip the test where a private tmpfs cannot be mounted (no unshare, or namespaces not allowed)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to mount a private tmpfs")
    probe = subprocess.run(
        [*on_tmpfs(directory, 1024 * 1024), "test", "-d", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {probe.stderr.strip()}")
