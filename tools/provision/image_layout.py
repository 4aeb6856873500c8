"""The image in an OCI layout (:mod:`tools.provision.image`): its layers added and its configuration
written by ``umoci``, under one build at a time on the machine. Stdlib only."""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
from pathlib import Path
from typing import Final

from tools.provision import controlplane as _cp
from tools.provision.image_layers import BASE_PACKAGES, HOME, PYTHON, SUITE, USER, base_layer, python_layers
from tools.provision.image_tools import ROOT, ImageError, Tools, cache_dir, run, source_epoch

PORTS: Final = ("9443/tcp", "9090/tcp", "10004/tcp", "10002/tcp")
ENV: Final = (
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "PYTHONUNBUFFERED=1",
    "PYTHONDONTWRITEBYTECODE=1",
    "LANG=C.UTF-8",
)
CREATED: Final = "1970-01-01T00:00:00Z"
"""Every time stamp in the image (``SOURCE_DATE_EPOCH`` overrides it): the same tree gives the same layers."""


def build(layout: Path, tag: str, *, tools: Tools, root: Path = ROOT, refresh: bool = False) -> str:
    """Build the image into the OCI ``layout`` (created if absent) as ``tag``; returns its manifest digest.

    Builds on one machine take turns (a lock in the cache): they share the cached layers.
    """
    cache_dir().mkdir(parents=True, exist_ok=True)
    with _cp._file_lock(cache_dir() / "build.lock"):
        return _build(layout, tag, tools=tools, root=root, refresh=refresh)


def _build(layout: Path, tag: str, *, tools: Tools, root: Path, refresh: bool) -> str:
    base, base_rootfs = base_layer(tools, refresh=refresh)
    created = _timestamp()
    # A fixed work directory: pip records the wheel's path in the image (direct_url.json), and the
    # same tree must give the same layers.
    work = cache_dir() / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        deps, app = python_layers(work, base_rootfs, root=root, refresh=refresh)
        if not (layout / "index.json").exists():
            layout.parent.mkdir(parents=True, exist_ok=True)
            run([tools.umoci, "init", "--layout", layout], what="umoci init")
        image = f"{layout}:{tag}"
        with contextlib.suppress(ImageError):
            run([tools.umoci, "rm", "--image", image], what="umoci rm")  # a rebuild replaces the tag
        run([tools.umoci, "new", "--image", image], what="umoci new")
        for what, layer in (
            (f"Debian {SUITE} {PYTHON} (mmdebstrap: {' '.join(BASE_PACKAGES)})", base),
            ("pip install nodetaskd[cloud] dependencies", deps),
            ("pip install nodetaskd", app),
        ):
            run(
                [
                    tools.umoci,
                    "raw",
                    "add-layer",
                    "--image",
                    image,
                    "--history.created",
                    created,
                    "--history.created_by",
                    what,
                    layer,
                ],
                what=f"umoci raw add-layer ({layer.name})",
            )
        config = [
            "--config.user",
            f"{USER}:{USER}",
            "--config.entrypoint",
            "/usr/local/bin/nodetaskd",
            "--config.workingdir",
            f"/{HOME}",
            "--config.label",
            "org.opencontainers.image.title=nodetaskd",
            "--config.label",
            f"org.opencontainers.image.version={tag}",
            "--config.label",
            "org.opencontainers.image.description=nodetaskd controller and cloud hub (the cloud extra)",
            "--architecture",
            "amd64",
            "--os",
            "linux",
            "--created",
            created,
            "--history.created",
            created,
            "--history.created_by",
            "image configuration",
        ]
        for env in ENV:
            config += ["--config.env", env]
        for port in PORTS:
            config += ["--config.exposedports", port]
        run([tools.umoci, "config", "--image", image, *config], what="umoci config")
        run([tools.umoci, "gc", "--layout", layout], what="umoci gc")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest_digest(layout, tag)


def _timestamp() -> str:
    epoch = source_epoch()
    if not epoch:
        return CREATED
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest_digest(layout: Path, tag: str) -> str:
    """The digest of the manifest ``tag`` names in the OCI ``layout``."""
    index = json.loads((layout / "index.json").read_text())
    for manifest in index.get("manifests", []):
        if manifest.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return str(manifest["digest"])
    raise ImageError(f"no image tagged {tag!r} in {layout}")
