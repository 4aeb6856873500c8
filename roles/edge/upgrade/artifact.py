"""The agent's upgrade artifact, fetched from an OCI registry over the distribution HTTP API.

An artifact is an image ``{repository}:{version}`` whose single layer holds the agent's Python
packages (``nodetask``, ``roles``, ``flows``, ``schemas``) and a ``VERSION`` file at its root
(``tools/provision/upgrade_artifact.py`` builds one). Nothing here needs a container runtime: the agent asks
the registry for the manifest (OCI or Docker, an index narrowed to this device's architecture),
downloads the layer blob, checks its digest and unpacks it beside the installed versions.

The decisions are pure functions (:func:`parse_manifest`, :func:`select_platform`,
:func:`expected_digest`, :func:`check_member`); the HTTP calls are the blocking calls of
:class:`roles.edge.upgrade.registry_client.RegistryClient` (with the bearer-token exchange registries such
as Docker Hub and GHCR ask for, anonymous: an upgrade has no registry credentials), which the async
entry points run in worker threads.
Image references are parsed by :func:`roles.common.registry_auth.parse_image`, as the pre-pull's are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

import anyio.to_thread

from nodetask import nesting
from roles.common.files import sync_directory
from roles.common.registry_auth import ImageRef, api_host, parse_image
from roles.edge.upgrade import registry_token
from roles.edge.upgrade.registry_client import RegistryClient, RegistryError, plain_http
from schemas.v1alpha2 import ImageDigestGetter

__all__ = [
    "ArtifactError",
    "Descriptor",
    "Resolved",
    "check_member",
    "device_arch",
    "expected_digest",
    "install",
    "parse_manifest",
    "reference",
    "resolve",
    "select_platform",
]

OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX: Final = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST: Final = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT: Final = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
INDEXES: Final = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFESTS: Final = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
LAYERS: Final = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
    }
)

MAX_MANIFEST_BYTES: Final = 4 << 20
VERSION_FILE: Final = "VERSION"
PACKAGES: Final = ("nodetask", "roles", "flows", "schemas")
AGENT_FILES: Final = tuple(f"{package}/__init__.py" for package in PACKAGES)
"""What an agent artifact must hold besides ``VERSION``: the agent's own packages."""

# Python's machine names to Go's GOARCH, the names image platforms and imageDigestGatter use.
_GOARCH: Final = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "armv6l": "arm",
    "i686": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}


class ArtifactError(Exception):
    """The artifact cannot be found, fetched, verified or unpacked; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A content descriptor of a manifest: what a digest points at."""

    media_type: str
    digest: str
    size: int
    platform: tuple[str, str] = ("", "")
    """(os, architecture), for an index's entries."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """An image manifest (only what the agent needs from it)."""

    layers: tuple[Descriptor, ...]


@dataclass(frozen=True, slots=True)
class Index:
    """A multi-platform index (OCI) or manifest list (Docker)."""

    manifests: tuple[Descriptor, ...]


@dataclass(frozen=True, slots=True)
class Resolved:
    """An artifact found in its registry: the manifest's digest and the layer to download."""

    ref: ImageRef
    digest: str
    """The digest of the manifest the tag names (an index's own digest when it is an index)."""
    platform_digest: str
    """The digest of this architecture's image manifest (the same as ``digest`` without an index)."""
    layer: Descriptor
    plain_http: bool
    insecure: tuple[str, ...] = ()
    """The agent's ``insecureRegistries``, which also decide whether a token realm may be plain HTTP."""
    tokens: registry_token.Tokens = field(default_factory=registry_token.Tokens, compare=False, repr=False)
    """The bearer tokens fetched while resolving, reused by :func:`install` until they expire."""


# ------------------------------------------------------------------------------------ pure parts


def reference(image: str, version: str) -> ImageRef:
    """``{image}:{version}``: the job's version replaces any tag or digest in ``image``, as KubeEdge documents.

    Errors: :class:`ArtifactError` for an image reference or a version docker would refuse.
    """
    try:
        return parse_image(image).with_tag(version)
    except ValueError as exc:
        raise ArtifactError(f"invalid upgrade image: {exc}") from None


def sha256(data: bytes) -> str:
    """The OCI digest of ``data``."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _descriptor(raw: Any, where: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise ArtifactError(f"{where} is not a descriptor")
    digest, size = raw.get("digest"), raw.get("size")
    if not isinstance(digest, str) or not digest.startswith("sha256:") or not isinstance(size, int) or size < 0:
        raise ArtifactError(f"{where} has no sha256 digest and size")
    plat = raw.get("platform") or {}
    return Descriptor(
        media_type=str(raw.get("mediaType", "")),
        digest=digest,
        size=size,
        platform=(str(plat.get("os", "")), str(plat.get("architecture", ""))) if isinstance(plat, dict) else ("", ""),
    )


def parse_manifest(body: bytes, content_type: str = "") -> Manifest | Index:
    """A manifest or index from its JSON; the media type comes from the document, else ``content_type``.

    Errors: :class:`ArtifactError` for anything that is neither, or is malformed.
    """
    try:
        nesting.check_json(body)
    except nesting.NestingError as exc:
        raise ArtifactError(f"the manifest is {exc}") from None
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise ArtifactError(f"the manifest is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ArtifactError("the manifest is not a JSON object")
    media_type = document.get("mediaType") or content_type.split(";", 1)[0].strip()
    if media_type in INDEXES or (not media_type and "manifests" in document):
        entries = document.get("manifests")
        if not isinstance(entries, list):
            raise ArtifactError("the index has no manifests")
        return Index(tuple(_descriptor(e, f"index entry {i}") for i, e in enumerate(entries)))
    if media_type in MANIFESTS or (not media_type and "layers" in document):
        layers = document.get("layers")
        if not isinstance(layers, list):
            raise ArtifactError("the manifest has no layers")
        return Manifest(tuple(_descriptor(e, f"layer {i}") for i, e in enumerate(layers)))
    raise ArtifactError(f"unsupported manifest media type {media_type!r}")


def device_arch(machine: str | None = None) -> str:
    """This device's architecture as GOARCH names it (``amd64``, ``arm64``...); unknown names pass through."""
    name = (machine if machine is not None else platform.machine()).lower()
    return _GOARCH.get(name, name)


def select_platform(index: Index, arch: str, os_name: str = "linux") -> Descriptor:
    """The index entry for ``os_name``/``arch``. Errors: :class:`ArtifactError` when there is none."""
    for entry in index.manifests:
        if entry.platform == (os_name, arch):
            return entry
    offered = ", ".join(sorted({"/".join(e.platform) for e in index.manifests})) or "none"
    raise ArtifactError(f"no image for {os_name}/{arch} in the index (it has: {offered})")


def expected_digest(getter: ImageDigestGetter, arch: str) -> str:
    """The digest ``imageDigestGatter`` expects on this architecture (KubeEdge reads only amd64 and arm64).

    Errors: :class:`ArtifactError` with KubeEdge's text for any other architecture.
    """
    if arch == "amd64":
        return getter.amd64
    if arch == "arm64":
        return getter.arm64
    raise ArtifactError(f"unsupported the arch {arch} to verify the image digest")


def single_layer(manifest: Manifest) -> Descriptor:
    """The artifact's one layer. Errors: :class:`ArtifactError` for another count or a non-tar layer."""
    if len(manifest.layers) != 1:
        raise ArtifactError(f"an upgrade artifact has exactly one layer, this image has {len(manifest.layers)}")
    layer = manifest.layers[0]
    if layer.media_type not in LAYERS:
        raise ArtifactError(f"unsupported layer media type {layer.media_type!r}")
    return layer


def check_member(name: str) -> PurePosixPath:
    """The relative path a layer entry unpacks to. Errors: :class:`ArtifactError` for an absolute path or ``..``."""
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/"):
        raise ArtifactError(f"the layer holds an absolute path {name!r}")
    if ".." in path.parts:
        raise ArtifactError(f"the layer holds a path leaving its directory {name!r}")
    return path


@contextlib.contextmanager
def _registry_errors(prefix: str = "") -> Iterator[None]:
    """The registry client's errors as :class:`ArtifactError`, with the same text after ``prefix``."""
    try:
        yield
    except RegistryError as exc:
        raise ArtifactError(f"{prefix}{exc}") from None


def _resolve(
    ref: ImageRef, plain: bool, insecure: tuple[str, ...], getter: ImageDigestGetter | None, arch: str
) -> Resolved:
    tokens = registry_token.Tokens()
    client = RegistryClient(ref, plain=plain, insecure=insecure, tokens=tokens)
    with _registry_errors(f"upgrade artifact {ref}: "):
        body, content_type = client.manifest(ref.tag, accept=ACCEPT, limit=MAX_MANIFEST_BYTES)
    digest = platform_digest = sha256(body)
    parsed = parse_manifest(body, content_type)
    if isinstance(parsed, Index):
        entry = select_platform(parsed, arch)
        with _registry_errors():
            body, content_type = client.manifest(entry.digest, accept=ACCEPT, limit=MAX_MANIFEST_BYTES)
        platform_digest = sha256(body)
        if platform_digest != entry.digest:
            raise ArtifactError(f"manifest digest mismatch: expected {entry.digest}, received {platform_digest}")
        parsed = parse_manifest(body, content_type)
        if isinstance(parsed, Index):
            raise ArtifactError(f"the index of {ref} points at another index")
    if getter is not None:
        expected = expected_digest(getter, arch)
        # Either pin is content-addressed: the tag's own manifest (index) or this architecture's manifest.
        if expected not in (digest, platform_digest):
            raise ArtifactError(
                f"the digest of {ref} for {arch} is {platform_digest},"
                f" imageDigestGatter expects {expected or '(empty)'}"
            )
    layer = single_layer(parsed)
    return Resolved(
        ref=ref,
        digest=digest,
        platform_digest=platform_digest,
        layer=layer,
        plain_http=plain,
        insecure=insecure,
        tokens=tokens,
    )


async def resolve(
    image: str,
    version: str,
    *,
    insecure: tuple[str, ...] = (),
    digests: ImageDigestGetter | None = None,
    arch: str | None = None,
) -> Resolved:
    """Find ``{image}:{version}`` in its registry and check it against ``digests`` when given.

    Errors: :class:`ArtifactError` naming the image and what is wrong (not found, unreachable,
    credentials needed, token exchange failed, digest mismatch, not an upgrade artifact).
    """
    ref = reference(image, version)
    plain = plain_http(api_host(ref.registry), insecure)
    return await anyio.to_thread.run_sync(_resolve, ref, plain, insecure, digests, arch or device_arch())


def _extract(archive: Path, target: Path) -> None:
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            check_member(member.name)
        # The 'data' filter also refuses links leaving the directory, devices and setuid bits.
        tar.extractall(target, members=members, filter="data")


def _verify_tree(tree: Path, version: str, required: tuple[str, ...]) -> None:
    try:
        found = (tree / VERSION_FILE).read_text().strip()
    except OSError:
        raise ArtifactError(f"the artifact has no {VERSION_FILE} file: it is not an upgrade artifact") from None
    if found != version:
        raise ArtifactError(f"the artifact holds version {found!r}, not {version!r}")
    missing = [name for name in required if not (tree / name).is_file()]
    if missing:
        raise ArtifactError(f"the artifact lacks {', '.join(missing)}")


def _install(resolved: Resolved, versions: Path, version: str, required: tuple[str, ...]) -> Path:
    target = versions / version
    stamp = target / ".artifact"
    if stamp.is_file() and json.loads(stamp.read_text()).get("layer") == resolved.layer.digest:
        return target  # already installed from this very layer (a resumed Upgrade)
    versions.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=versions))
    try:
        archive = work / "layer.tar"
        client = RegistryClient(
            resolved.ref, plain=resolved.plain_http, insecure=resolved.insecure, tokens=resolved.tokens
        )
        with _registry_errors():
            client.blob(resolved.layer.digest, resolved.layer.size, archive)
        tree = work / "tree"
        tree.mkdir()
        try:
            _extract(archive, tree)
        except (tarfile.TarError, OSError) as exc:
            raise ArtifactError(f"cannot unpack layer {resolved.layer.digest}: {exc}") from None
        _verify_tree(tree, version, required)
        (tree / ".artifact").write_text(
            json.dumps({"image": str(resolved.ref), "digest": resolved.digest, "layer": resolved.layer.digest})
        )
        if target.exists():
            # A different or partial install of the same version: moved aside, never half-replaced.
            stale = work / "stale"
            target.rename(stale)
        tree.rename(target)
        sync_directory(versions)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    return target


async def install(resolved: Resolved, versions: Path, version: str, *, required: tuple[str, ...] = AGENT_FILES) -> Path:
    """Download, verify and unpack the artifact into ``versions/<version>``; returns that directory.

    ``required`` are the files it must hold besides ``VERSION`` (the agent's packages; a kubelet
    artifact's ``kubelet``).

    The tree is unpacked in a temporary directory beside it and renamed into place, so
    ``versions/<version>`` is either absent or complete. Idempotent: a version already installed
    from the same layer is kept as it is.

    Errors: :class:`ArtifactError`.
    """
    return await anyio.to_thread.run_sync(_install, resolved, versions, version, required)
