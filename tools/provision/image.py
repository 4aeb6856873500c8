#!/usr/bin/env python3
"""Build the controller's and hubs' image without a container engine, into an OCI layout, and push it.

What ``containers/Containerfile`` builds with a daemon, assembled here from parts this machine can
reach (Debian's archive and PyPI; no registry holds a base image for us):

1. **base** - Debian bookworm's ``python3.11`` and the libraries it and the wheels link against,
   extracted by ``mmdebstrap --variant=extract`` (with bookworm's security updates), without
   documentation, plus a ``nodetaskd`` user (65532) and its writable home ``/var/lib/nodetaskd``;
2. **deps** - the wheels of the ``cloud`` extra's closure, chosen by pip for CPython 3.11 on
   manylinux x86_64 whatever Python runs this script, installed into
   ``/usr/local/lib/python3.11/dist-packages`` (on Debian's ``sys.path``);
3. **app** - this working tree's ``nodetaskd`` wheel and the ``/usr/local/bin/nodetaskd`` entry point.

Every layer is an uncompressed tar with sorted entries, zero times and numeric owners, its Python
compiled to unchecked-hash bytecode by the image's own interpreter (so that nothing is compiled at
run time, on a read-only root); ``umoci`` puts the layers and the config (user 65532, entry point,
environment, ports) into the layout and ``skopeo`` copies it to a registry. The base and deps
layers are cached in ``~/.cache/nodetaskd/image`` (keyed by what went into them), so a rebuild after
a code change costs the app layer only. Usage::

    python3 tools/provision/image.py                                    # build into the cache's layout
    python3 tools/provision/image.py --push 127.0.0.1:5000/nodetaskd:0.1.0
    python3 tools/provision/image.py --layout /tmp/oci --tag 0.1.0 --push registry.example.com/nodetaskd:0.1.0

The last line printed is the pushed reference with its digest (``host/repo@sha256:...``), or the
layout and tag when nothing is pushed. Plain HTTP (no TLS verification) is used for loopback
registries only. Missing Debian tools (mmdebstrap, umoci, skopeo) are installed with apt-get (root).
Stdlib only, like the other provisioning scripts.

This module is the command and :func:`build_and_push`; the layers are made in :mod:`tools.provision.image_layers`,
put into the OCI layout in :mod:`tools.provision.image_layout` and pushed in :mod:`tools.provision.image_push`,
with what those share (the tools, running them, the cache) in :mod:`tools.provision.image_tools`.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

try:
    from tools.provision import containerd as _ctd
    from tools.provision import controlplane as _cp
except ModuleNotFoundError:  # run as a script: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools.provision import containerd as _ctd
    from tools.provision import controlplane as _cp
from tools.provision.image_layout import build
from tools.provision.image_push import push
from tools.provision.image_tools import ROOT, ImageError, cache_dir, ensure_tools


def build_and_push(reference: str, *, layout: Path | None = None, tag: str = "", refresh: bool = False) -> str:
    """Build the image and push it to ``reference``; returns ``host/repository@digest``."""
    repository, _, ref_tag = reference.rpartition(":")
    if "/" in ref_tag or not repository:
        repository, ref_tag = reference, ""
    tag = tag or ref_tag or project_version()
    tools = ensure_tools()
    layout = layout or cache_dir() / "oci"
    build(layout, tag, tools=tools, refresh=refresh)
    target = reference if ref_tag else f"{repository}:{tag}"
    return f"{repository}@{push(layout, tag, target, tools=tools)}"


def project_version(root: Path = ROOT) -> str:
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="image.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", type=Path, help="OCI layout directory (default: ~/.cache/nodetaskd/image/oci)")
    parser.add_argument("--tag", default="", help="tag in the layout (default: the push tag, else the version)")
    parser.add_argument("--push", metavar="HOST/REPOSITORY[:TAG]", help="push the image there and print its digest")
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="extract Debian's packages (security updates) and resolve the wheels again",
    )
    args = parser.parse_args(argv)
    try:
        if args.push:
            print(build_and_push(args.push, layout=args.layout, tag=args.tag, refresh=args.refresh))
            return 0
        tools = ensure_tools()
        layout = args.layout or cache_dir() / "oci"
        tag = args.tag or project_version()
        digest = build(layout, tag, tools=tools, refresh=args.refresh)
        print(f"oci:{layout}:{tag} {digest}")
    except (ImageError, _ctd.RuntimeServicesError, _cp.ControlPlaneError) as exc:
        print(f"image: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
