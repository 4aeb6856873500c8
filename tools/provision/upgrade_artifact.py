#!/usr/bin/env python3
"""Build an upgrade artifact of THIS project at a given version and push it to a registry.

The artifact is what a NodeUpgradeJob installs on a device (``roles/edge/upgrade/artifact.py``): an OCI
image whose single gzip layer holds the agent's packages (``nodetask``, ``roles``, ``flows``,
``schemas``, as they are in this working tree) and a ``VERSION`` file. The image is pushed with the
registry's own HTTP API (blob uploads, then the manifest), stdlib only, so no container tool is
needed; the layer is reproducible (sorted entries, zero times and owners), so the same tree and
version always give the same digests. Usage::

    python3 tools/provision/upgrade_artifact.py 127.0.0.1:5000/nodetaskd/agent v0.2.0
    python3 tools/provision/upgrade_artifact.py 127.0.0.1:5000/nodetaskd/agent v0.9.0 --broken   # fails at start
    python3 tools/provision/upgrade_artifact.py 127.0.0.1:5000/nodetaskd/agent v0.2.0 --index    # amd64 + arm64 index
    python3 tools/provision/upgrade_artifact.py 127.0.0.1:5000/nodetaskd/kubelet v1.20.3 --kubelet ./kubelet

A kubelet artifact (``--kubelet``) holds ``VERSION`` and the executable ``kubelet`` instead of the packages;
``--kubelet-broken`` pushes a kubelet that answers ``--version`` and exits at once otherwise.

It prints the digest of what the tag names. Plain HTTP is used for loopback registries (the
test and demo ones), HTTPS otherwise; pushes are anonymous, or carry a bearer token the caller got
from the registry's token service (:func:`push`'s ``token``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
PACKAGES: Final = ("nodetask", "roles", "flows", "schemas")
OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX: Final = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG: Final = "application/vnd.oci.image.config.v1+json"
OCI_LAYER: Final = "application/vnd.oci.image.layer.v1.tar+gzip"
BROKEN_CLI: Final = (
    '"""A deliberately broken build (tools/provision/upgrade_artifact.py --broken): it fails as it starts."""\n\n'
    'raise RuntimeError("this nodetaskd build is broken on purpose")\n'
)


class PushError(RuntimeError):
    """The registry refused or could not be reached; the message says which request."""


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _files(root: Path) -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path.relative_to(root).as_posix(), path


def _layer(entries: Iterator[tuple[str, bytes, int]], *, level: int = 9) -> tuple[bytes, str]:
    """A reproducible gzip layer of ``(name, data, mode)`` entries and its diff ID (the uncompressed tar's digest)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    return gzip.compress(tar_bytes, compresslevel=level, mtime=0), _digest(tar_bytes)


def build_layer(version: str, *, root: Path = ROOT, broken: bool = False) -> tuple[bytes, str]:
    """The gzip layer of the agent's artifact and the digest of its uncompressed tar (the image's diff ID)."""

    def entries() -> Iterator[tuple[str, bytes, int]]:
        yield "VERSION", f"{version}\n".encode(), 0o644
        for name, path in _files(root):
            yield name, BROKEN_CLI.encode() if broken and name == "roles/cli/main.py" else path.read_bytes(), 0o644

    return _layer(entries())


def broken_kubelet(version: str) -> bytes:
    """A kubelet that passes the agent's ``--version`` check and exits at once when started as a kubelet."""
    return (
        "#!/bin/sh\n"
        "# A deliberately broken kubelet build (tools/provision/upgrade_artifact.py --kubelet-broken).\n"
        f'if [ "$1" = --version ]; then echo "Kubernetes {version}"; exit 0; fi\n'
        'echo "this kubelet build is broken on purpose" >&2\n'
        "exit 1\n"
    ).encode()


def build_kubelet_layer(version: str, kubelet: bytes) -> tuple[bytes, str]:
    """The gzip layer of a kubelet artifact: ``VERSION`` and the executable ``kubelet``, and its diff ID."""
    # Level 1: a kubelet is 100+ MB, and level 9 takes ten times as long for a few per cent.
    return _layer(iter((("VERSION", f"{version}\n".encode(), 0o644), ("kubelet", kubelet, 0o755))), level=1)


class _Registry:
    def __init__(self, host: str, repository: str, token: str = "") -> None:
        loopback = host.split(":", maxsplit=1)[0] in ("127.0.0.1", "localhost", "[::1]")
        self.base = f"{'http' if loopback else 'https'}://{host}"
        self.repository = repository
        self.token = token

    def _call(
        self, method: str, url: str, body: bytes | None = None, content_type: str = ""
    ) -> tuple[int, dict[str, str]]:
        headers = {"Content-Type": content_type} if content_type else {}
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        if self.token:
            # Unredirected: a registry may send uploads elsewhere, and the token is for it alone.
            request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return int(resp.status), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            if method == "HEAD" and exc.code == 404:
                return 404, {}
            detail = exc.read().decode(errors="replace")[:300]
            raise PushError(f"{method} {url}: {exc.code} {exc.reason} {detail}") from None
        except OSError as exc:
            raise PushError(f"{method} {url}: {exc}") from None

    def blob(self, data: bytes) -> str:
        digest = _digest(data)
        status, _ = self._call("HEAD", f"{self.base}/v2/{self.repository}/blobs/{digest}")
        if status == 200:
            return digest
        _, headers = self._call("POST", f"{self.base}/v2/{self.repository}/blobs/uploads/")
        location = urllib.parse.urljoin(self.base, headers["Location"])
        separator = "&" if "?" in location else "?"
        self._call("PUT", f"{location}{separator}digest={digest}", data, "application/octet-stream")
        return digest

    def manifest(self, reference: str, document: bytes, media_type: str) -> str:
        self._call("PUT", f"{self.base}/v2/{self.repository}/manifests/{reference}", document, media_type)
        return _digest(document)


def _image_manifest(registry: _Registry, layer: bytes, diff_id: str, arch: str) -> bytes:
    config = json.dumps(
        {"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": [diff_id]}, "config": {}},
        sort_keys=True,
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": registry.blob(config), "size": len(config)},
        "layers": [{"mediaType": OCI_LAYER, "digest": registry.blob(layer), "size": len(layer)}],
    }
    return json.dumps(manifest, sort_keys=True).encode()


def push(
    image: str,
    version: str,
    *,
    broken: bool = False,
    index: bool = False,
    arch: str = "amd64",
    root: Path = ROOT,
    token: str = "",
    kubelet: bytes | None = None,
) -> str:
    """Build the artifact of ``root`` at ``version`` and push it as ``{image}:{version}``; returns the tag's digest.

    ``image`` is ``host[:port]/repository``. With ``index`` the tag names an OCI index of one image
    per architecture (amd64 and arm64, the same layer); otherwise one image for ``arch``. ``token``
    is a bearer token granting push (and pull) on the repository, sent with every request. With
    ``kubelet`` (an executable's bytes) the artifact is a kubelet's instead of the agent's.
    """
    host, _, repository = image.partition("/")
    if not repository:
        raise PushError(f"image {image!r} has no registry host")
    registry = _Registry(host, repository, token)
    if kubelet is not None:
        layer, diff_id = build_kubelet_layer(version, kubelet)
    else:
        layer, diff_id = build_layer(version, root=root, broken=broken)
    if not index:
        return registry.manifest(version, _image_manifest(registry, layer, diff_id, arch), OCI_MANIFEST)
    entries = []
    for platform_arch in ("amd64", "arm64"):
        document = _image_manifest(registry, layer, diff_id, platform_arch)
        digest = registry.manifest(_digest(document), document, OCI_MANIFEST)
        entries.append(
            {
                "mediaType": OCI_MANIFEST,
                "digest": digest,
                "size": len(document),
                "platform": {"os": "linux", "architecture": platform_arch},
            }
        )
    document = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, sort_keys=True).encode()
    return registry.manifest(version, document, OCI_INDEX)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="upgrade_artifact.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("image", help="host[:port]/repository to push to")
    parser.add_argument("version", help="the version (tag, and the VERSION file), e.g. v0.2.0")
    parser.add_argument("--broken", action="store_true", help="a build whose roles/cli/main.py raises at start")
    parser.add_argument("--index", action="store_true", help="push an amd64 + arm64 index")
    parser.add_argument("--kubelet", type=Path, help="push a kubelet artifact of this executable instead")
    parser.add_argument("--kubelet-broken", action="store_true", help="push a kubelet that exits at once")
    args = parser.parse_args(argv)
    kubelet = broken_kubelet(args.version) if args.kubelet_broken else None
    try:
        if args.kubelet is not None:
            kubelet = args.kubelet.read_bytes()
        print(push(args.image, args.version, broken=args.broken, index=args.index, kubelet=kubelet))
    except OSError as exc:
        print(f"upgrade_artifact: error: cannot read {args.kubelet}: {exc}", file=sys.stderr)
        return 1
    except PushError as exc:
        print(f"upgrade_artifact: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
