"""The upgrade artifact's pure parts: references, manifests, platform and digest choice, safe unpacking."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from roles.common.registry_auth import parse_image
from roles.edge.upgrade import artifact
from roles.edge.upgrade.artifact import (
    ArtifactError,
    Descriptor,
    Index,
    Manifest,
    check_member,
    device_arch,
    expected_digest,
    parse_manifest,
    reference,
    select_platform,
    single_layer,
)
from roles.edge.upgrade.registry_client import RegistryClient, plain_http, same_origin
from roles.edge.upgrade.registry_token import Tokens
from schemas.v1alpha2 import ImageDigestGetter
from tools.provision import upgrade_artifact

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_DIGEST = "sha256:" + "a" * 64
LAYER = {"mediaType": LAYER_TYPE, "digest": LAYER_DIGEST, "size": 10}


def _index() -> Index:
    entries = [
        {
            "mediaType": artifact.OCI_MANIFEST,
            "digest": f"sha256:{c * 64}",
            "size": 1,
            "platform": {"os": "linux", "architecture": a},
        }
        for c, a in (("1", "amd64"), ("2", "arm64"))
    ]
    parsed = parse_manifest(json.dumps({"mediaType": artifact.OCI_INDEX, "manifests": entries}).encode())
    assert isinstance(parsed, Index)
    return parsed


@pytest.mark.parametrize(
    ("image", "registry", "repository", "endpoint"),
    [
        ("busybox", "docker.io", "library/busybox", "registry-1.docker.io"),
        ("library/busybox", "docker.io", "library/busybox", "registry-1.docker.io"),
        ("docker.io/x/y", "docker.io", "x/y", "registry-1.docker.io"),
        ("index.docker.io/x/y", "docker.io", "x/y", "registry-1.docker.io"),
        ("registry-1.docker.io/x/y:old", "docker.io", "x/y", "registry-1.docker.io"),
        ("localhost:5000/a", "localhost:5000", "a", "localhost:5000"),
        ("localhost/agent", "localhost", "agent", "localhost"),
        ("127.0.0.1:5000/a/b:tag", "127.0.0.1:5000", "a/b", "127.0.0.1:5000"),
        ("reg.example.com/a@sha256:" + "b" * 64, "reg.example.com", "a", "reg.example.com"),
    ],
)
def test_the_artifact_and_the_pre_pull_read_an_image_reference_alike(
    image: str, registry: str, repository: str, endpoint: str
) -> None:
    """One parser: the same registry and repository as the pre-pull's, the job's version as the tag.

    Only the HTTP request goes to Docker Hub's API host; the reference keeps the name ``docker.io``.
    """
    ref = reference(image, "v0.2.0")
    parsed = parse_image(image)
    assert (ref.registry, ref.repository) == (parsed.registry, parsed.repository) == (registry, repository)
    assert (ref.tag, ref.digest) == ("v0.2.0", "")
    client = RegistryClient(ref, plain=False, insecure=(), tokens=Tokens())
    assert client.base == f"https://{endpoint}/v2/{repository}"


@pytest.mark.parametrize(
    ("image", "version", "message"),
    [
        ("Agent", "v1", "the repository name must be lowercase"),
        ("reg.example.com/agent", "v1 beta", "invalid tag 'v1 beta'"),
        ("reg.example.com/agent", "", "invalid tag ''"),
        ("", "v1", "image reference is empty"),
    ],
)
def test_an_invalid_upgrade_image_or_version_is_refused(image: str, version: str, message: str) -> None:
    """What docker would refuse as a reference is an error naming the broken part."""
    with pytest.raises(ArtifactError, match=f"^invalid upgrade image: .*{message}"):
        reference(image, version)


def test_manifests_are_told_apart_by_media_type_from_the_document_or_the_header() -> None:
    """An OCI manifest, a Docker manifest named only by Content-Type, and an index all parse."""
    oci = parse_manifest(json.dumps({"mediaType": artifact.OCI_MANIFEST, "layers": [LAYER]}).encode())
    docker = parse_manifest(json.dumps({"layers": [LAYER]}).encode(), artifact.DOCKER_MANIFEST + "; charset=utf-8")
    assert oci == docker == Manifest((Descriptor(LAYER_TYPE, LAYER_DIGEST, 10),))
    assert [e.platform for e in _index().manifests] == [("linux", "amd64"), ("linux", "arm64")]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        json.dumps({"mediaType": "application/vnd.unknown"}).encode(),
        json.dumps({"layers": [{"digest": "md5:x"}]}).encode(),
    ],
)
def test_a_malformed_manifest_is_an_error(body: bytes) -> None:
    """Anything that is not a well-formed manifest or index is refused with a reason."""
    with pytest.raises(ArtifactError):
        parse_manifest(body)


def test_a_deeply_nested_manifest_is_an_error_naming_the_limit() -> None:
    """A registry answering a manifest nested 10,000 deep gets a clear refusal, not a RecursionError in the agent."""
    with pytest.raises(ArtifactError, match="nested too deeply: more than 64 levels"):
        parse_manifest(b'{"layers": ' + b"[" * 10_000 + b"]" * 10_000 + b"}")


def test_an_index_is_narrowed_to_this_devices_architecture() -> None:
    """The entry for linux/<arch> is chosen; a missing one is an error listing what the index offers."""
    assert select_platform(_index(), "arm64").digest == "sha256:" + "2" * 64
    with pytest.raises(ArtifactError, match=r"no image for linux/riscv64 .*linux/amd64, linux/arm64"):
        select_platform(_index(), "riscv64")


def test_machine_names_map_to_goarch() -> None:
    """Python's machine names become the architecture names images and imageDigestGatter use."""
    assert [device_arch(m) for m in ("x86_64", "aarch64", "arm64", "riscv64")] == ["amd64", "arm64", "arm64", "riscv64"]


def test_the_expected_digest_is_read_for_amd64_and_arm64_only() -> None:
    """As KubeEdge: amd64 and arm64 pick their field, any other architecture is refused with its text."""
    getter = ImageDigestGetter(amd64="sha256:amd", arm64="sha256:arm")
    assert (expected_digest(getter, "amd64"), expected_digest(getter, "arm64")) == ("sha256:amd", "sha256:arm")
    with pytest.raises(ArtifactError, match=r"^unsupported the arch s390x to verify the image digest$"):
        expected_digest(getter, "s390x")


def test_an_artifact_has_exactly_one_tar_layer() -> None:
    """Two layers, or a layer that is not a tar, is not an upgrade artifact."""
    layer = Descriptor(LAYER_TYPE, LAYER_DIGEST, 10)
    assert single_layer(Manifest((layer,))) == layer
    with pytest.raises(ArtifactError, match="exactly one layer"):
        single_layer(Manifest((layer, layer)))
    with pytest.raises(ArtifactError, match="media type"):
        single_layer(Manifest((Descriptor("application/zip", LAYER_DIGEST, 10),)))


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside", "roles/../../outside", "./../x"])
def test_layer_entries_leaving_the_version_directory_are_refused(name: str) -> None:
    """Absolute paths and ``..`` components are rejected by name, before anything is written."""
    with pytest.raises(ArtifactError):
        check_member(name)


def test_unpacking_a_layer_with_an_escaping_entry_writes_nothing(tmp_path: Path) -> None:
    """A layer with one bad entry among good ones is refused whole."""
    archive = tmp_path / "layer.tar"
    with tarfile.open(archive, "w") as tar:
        for name in ("VERSION", "../escaped"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"x\n"))
    target = tmp_path / "tree"
    target.mkdir()
    with pytest.raises(ArtifactError, match="leaving its directory"):
        artifact._extract(archive, target)
    assert list(target.iterdir()) == []
    assert not (tmp_path / "escaped").exists()


def test_loopback_and_listed_registries_use_plain_http_others_https() -> None:
    """Plain HTTP only for loopback hosts and the configured insecure registries."""
    assert [plain_http(h) for h in ("127.0.0.1:5000", "localhost:5000", "[::1]:5000")] == [True, True, True]
    assert plain_http("registry.lan:5000", ("registry.lan:5000",))
    assert [plain_http(h) for h in ("registry.lan:5000", "registry-1.docker.io")] == [False, False]


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        ("https://reg.example.com/v2/a", "https://reg.example.com:443/blobs/x", True),
        ("http://127.0.0.1:5000/v2/a", "http://127.0.0.1:5000/other?x=1", True),
        ("https://REG.example.com/v2/a", "https://reg.example.com/b", True),
        ("https://reg.example.com/v2/a", "http://reg.example.com/v2/a", False),
        ("http://127.0.0.1:5000/v2/a", "http://127.0.0.1:5001/v2/a", False),
        ("https://registry-1.docker.io/v2/a", "https://production.cloudflare.docker.com/x", False),
        ("https://reg.example.com/v2/a", "https://reg.example.com.evil.net/v2/a", False),
        ("https://reg.example.com/", "https://reg.example.com:99999/", False),
    ],
)
def test_only_the_same_scheme_host_and_port_is_the_same_origin(first: str, second: str, same: bool) -> None:
    """A redirect keeps the registry's token only where this says the origin is unchanged."""
    assert same_origin(first, second) is same


def test_the_artifact_tool_builds_a_reproducible_layer_of_this_project(tmp_path: Path) -> None:
    """The same tree and version give the same bytes; the layer unpacks to VERSION and the packages."""
    first, diff_id = upgrade_artifact.build_layer("v0.2.0")
    assert upgrade_artifact.build_layer("v0.2.0") == (first, diff_id)
    (tmp_path / "layer.tar.gz").write_bytes(first)
    artifact._extract(tmp_path / "layer.tar.gz", tmp_path)
    artifact._verify_tree(tmp_path, "v0.2.0", artifact.AGENT_FILES)
    with pytest.raises(ArtifactError, match=r"holds version 'v0\.2\.0', not 'v0\.3\.0'"):
        artifact._verify_tree(tmp_path, "v0.3.0", artifact.AGENT_FILES)
    with pytest.raises(ArtifactError, match=r"the artifact lacks kubelet$"):
        artifact._verify_tree(tmp_path, "v0.2.0", ("kubelet",))
    broken, _ = upgrade_artifact.build_layer("v0.9.0", broken=True)
    with tarfile.open(fileobj=io.BytesIO(broken)) as tar:
        cli = tar.extractfile("roles/cli/main.py")
        assert cli is not None
        assert b"raise RuntimeError" in cli.read()
