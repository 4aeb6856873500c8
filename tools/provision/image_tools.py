"""What every step of the image build (:mod:`tools.provision.image`) uses: the Debian tools it runs
(mmdebstrap, umoci, skopeo), running them, its cache, and the one time stamp its files get. Stdlib only."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tools.provision import containerd as _ctd
from tools.provision import controlplane as _cp

ROOT: Final = _cp.REPO_ROOT


class ImageError(RuntimeError):
    """A step of the build or the push failed; the message names it."""


def log(message: str) -> None:
    """A progress line on stderr (stdout carries only the result)."""
    print(f"[image] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where the cached layers, the default layout and the build lock live."""
    return _cp.cache_dir() / "image"


@dataclass(frozen=True)
class Tools:
    """The Debian tools the build runs."""

    mmdebstrap: Path
    umoci: Path
    skopeo: Path


def ensure_tools() -> Tools:
    """mmdebstrap, umoci and skopeo, installed from Debian when missing (under the shared apt lock)."""
    runtime = _ctd.ensure_tools()
    if _cp._which("mmdebstrap") is None:
        cache = _cp.cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        with _cp._file_lock(cache / "apt.lock"):
            if _cp._which("mmdebstrap") is None:
                _cp._apt_install(["mmdebstrap"])
    found = _cp._which("mmdebstrap")
    if found is None:
        raise ImageError("mmdebstrap is still not on PATH after installing it")
    return Tools(mmdebstrap=found, umoci=runtime.umoci, skopeo=runtime.skopeo)


def run(argv: Sequence[str | Path], *, what: str, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run a step of the build; its stdout, or ImageError naming ``what`` with the end of its output."""
    result = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, check=False, timeout=timeout, env=env
    )
    if result.returncode != 0:
        lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise ImageError(f"{what} failed (exit {result.returncode}): {' | '.join(lines[-5:]) or '(no output)'}")
    return result.stdout


def cache_key(*parts: object) -> str:
    """A short digest of what went into a cached layer."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def source_epoch() -> int:
    """The one time every file and history entry of the image gets (``SOURCE_DATE_EPOCH``, else 0)."""
    return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
