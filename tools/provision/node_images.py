"""The two images a real node here runs, made without a registry or a container engine.

Nothing can be pulled from public registries on these machines, so both images are packed here, as OCI
archives with one uncompressed layer, and imported into each node's containerd (``k8s.io`` namespace):

- :data:`PAUSE_IMAGE`, the pod sandbox: Kubernetes' own ``pause`` program, compiled statically from the
  same Debian source as the kubelet (:mod:`tools.provision.kubebuild`);
- :data:`WEB_IMAGE`, a small web application: Debian's static busybox running ``httpd -f -p 8088 -h /www``.
  ``/www/index.html`` says ``nodetaskd web``; a pod serves something of its own by mounting a ConfigMap at
  ``/www`` (or running ``/bin/sh -c``); :func:`web_pod` writes such a pod.

The archives are cached in ``~/.cache/nodetaskd/node-images`` under names carrying
:data:`IMAGES_REVISION`. Standard library only, like the other provisioning scripts.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import struct
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tools.provision import host, kubebuild

IMAGES_REVISION: Final = 1
"""Bumped whenever what goes into an image changes, so that a stale cached archive is never imported."""
PAUSE_IMAGE: Final = f"nodetaskd.local/pause:{kubebuild.KUBERNETES_VERSION}-{IMAGES_REVISION}"
WEB_IMAGE: Final = f"nodetaskd.local/web:{IMAGES_REVISION}"
WEB_PORT: Final = 8088
WEB_PAGE: Final = b"nodetaskd web\n"
"""What the web image serves at ``/`` unless a pod mounts its own ``/www``."""
BUSYBOX_APPLETS: Final = ("sh", "httpd", "cat", "echo", "ls", "sleep", "wget", "hostname")

_OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
_OCI_CONFIG: Final = "application/vnd.oci.image.config.v1+json"
_OCI_LAYER: Final = "application/vnd.oci.image.layer.v1.tar"
_ARCHITECTURES: Final[Mapping[str, str]] = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}


@dataclass(frozen=True)
class Images:
    """The cached OCI archives, by image reference."""

    pause: Path
    web: Path

    def archives(self) -> dict[str, Path]:
        return {PAUSE_IMAGE: self.pause, WEB_IMAGE: self.web}


@dataclass(frozen=True)
class _File:
    path: str
    """Inside the image, without a leading slash."""
    data: bytes = b""
    mode: int = 0o644
    link: str = ""
    """A symbolic link's target (then ``data`` is unused)."""
    directory: bool = False


def _is_static(path: Path) -> bool:
    """Whether the ELF executable ``path`` names no program interpreter (so it runs alone in an image)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise host.ControlPlaneError(f"{path} is not a 64-bit ELF executable")
    (e_phoff,) = struct.unpack_from("<Q", data, 0x20)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 0x36)
    for index in range(e_phnum):
        (p_type,) = struct.unpack_from("<I", data, e_phoff + index * e_phentsize)
        if p_type == 3:  # PT_INTERP
            return False
    return True


def _layer(files: Sequence[_File]) -> bytes:
    """A reproducible layer: sorted entries, one time stamp (0), owned by root."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for entry in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(entry.path)
            info.mode = entry.mode
            if entry.directory:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.link:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.link
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return out.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return f"sha256:{hashlib.sha256(data).hexdigest()}", data


def oci_archive(reference: str, files: Sequence[_File], config: Mapping[str, object]) -> bytes:
    """An OCI image layout as a tar (what ``ctr images import`` reads) holding one image named
    ``reference``, with one layer of ``files`` and ``config`` as its runtime configuration."""
    arch = _ARCHITECTURES.get(platform.machine(), platform.machine())
    layer_digest, layer = _blob(_layer(files))
    image_config = {
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_digest, config_blob = _blob(json.dumps(image_config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": _OCI_MANIFEST,
        "config": {"mediaType": _OCI_CONFIG, "digest": config_digest, "size": len(config_blob)},
        "layers": [{"mediaType": _OCI_LAYER, "digest": layer_digest, "size": len(layer)}],
    }
    manifest_digest, manifest_blob = _blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": _OCI_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_blob),
                "platform": {"architecture": arch, "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": reference,
                    "org.opencontainers.image.ref.name": reference.rpartition(":")[2],
                },
            }
        ],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        **{
            f"blobs/sha256/{digest.removeprefix('sha256:')}": data
            for digest, data in ((layer_digest, layer), (config_digest, config_blob), (manifest_digest, manifest_blob))
        },
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _pause_archive(pause: Path) -> bytes:
    files = [_File("pause", pause.read_bytes(), mode=0o755)]
    return oci_archive(PAUSE_IMAGE, files, {"Entrypoint": ["/pause"]})


def _web_archive(busybox: Path) -> bytes:
    if not _is_static(busybox):
        raise host.ControlPlaneError(f"{busybox} is linked dynamically; the web image needs busybox-static's")
    files = [
        _File("bin", directory=True, mode=0o755),
        _File("bin/busybox", busybox.read_bytes(), mode=0o755),
        *(_File(f"bin/{applet}", link="busybox") for applet in BUSYBOX_APPLETS),
        _File("www", directory=True, mode=0o755),
        _File("www/index.html", WEB_PAGE),
        _File("tmp", directory=True, mode=0o1777),
    ]
    config = {
        "Entrypoint": ["/bin/busybox", "httpd", "-f", "-p", str(WEB_PORT), "-h", "/www"],
        "Env": ["PATH=/bin"],
        "ExposedPorts": {f"{WEB_PORT}/tcp": {}},
    }
    return oci_archive(WEB_IMAGE, files, config)


def ensure_images() -> Images:
    """The cached archives of both images, made first if missing (the pause program built, busybox-static
    installed, as needed)."""
    directory = host.cache_dir() / "node-images"
    images = Images(
        pause=directory / f"pause-{kubebuild.KUBERNETES_VERSION}-{IMAGES_REVISION}.oci.tar",
        web=directory / f"web-{IMAGES_REVISION}.oci.tar",
    )
    if images.pause.is_file() and images.web.is_file():
        return images
    directory.mkdir(parents=True, exist_ok=True)
    pause = kubebuild.ensure_built(("pause",))["pause"]
    if not host.dpkg_installed("busybox-static"):
        with host.file_lock(host.cache_dir() / "apt.lock"):
            if not host.dpkg_installed("busybox-static"):
                host.apt_install(["busybox-static"])
    busybox = Path("/bin/busybox")
    with host.file_lock(directory / "build.lock"):
        if not images.pause.is_file():
            host.write_atomic(images.pause, _pause_archive(pause))
        if not images.web.is_file():
            host.write_atomic(images.web, _web_archive(busybox.resolve()))
    return images


def import_images(ctr: Path, address: Path, images: Images) -> None:
    """Import both images into the containerd at ``address`` (its ``k8s.io`` namespace, which the CRI
    plugin serves), unpacked for the ``native`` snapshotter the nodes use."""
    for reference, archive in images.archives().items():
        host.run_quiet(
            [
                str(ctr),
                f"--address={address}",
                "--namespace=k8s.io",
                "images",
                "import",
                "--snapshotter=native",
                str(archive),
            ],
            what=f"ctr images import {reference}",
            env={**os.environ, "CONTAINERD_NAMESPACE": "k8s.io"},
        )


def web_pod(
    name: str,
    node: str,
    *,
    page_configmap: str | None = None,
    command: Sequence[str] | None = None,
    automount_service_account_token: bool = False,
) -> dict[str, Any]:
    """A Pod bound to ``node`` running :data:`WEB_IMAGE` (never pulled), serving
    :data:`WEB_PAGE` on port :data:`WEB_PORT`, or the files of ConfigMap
    ``page_configmap`` mounted at ``/www``; ``command`` replaces the image's entry point."""
    container: dict[str, Any] = {
        "name": "web",
        "image": WEB_IMAGE,
        "imagePullPolicy": "Never",
        "ports": [{"containerPort": WEB_PORT}],
    }
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [container],
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": automount_service_account_token,
    }
    if command is not None:
        container["command"] = list(command)
    if page_configmap is not None:
        container["volumeMounts"] = [{"name": "www", "mountPath": "/www", "readOnly": True}]
        spec["volumes"] = [{"name": "www", "configMap": {"name": page_configmap}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


__all__ = [
    "IMAGES_REVISION",
    "PAUSE_IMAGE",
    "WEB_IMAGE",
    "WEB_PAGE",
    "WEB_PORT",
    "Images",
    "ensure_images",
    "import_images",
    "oci_archive",
    "web_pod",
]
