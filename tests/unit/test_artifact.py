"""The upgrade artifact's pure parts: references, manifests, platform and digest choice, safe unpacking."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from roles.edge import artifact
from roles.edge.artifact import (
    ArtifactError,
    Descriptor,
    ImageRef,
    Index,
    Manifest,
    check_member,
    device_arch,
    expected_digest,
    parse_manifest,
    plain_http,
    select_platform,
    single_layer,
)
from schemas.v1alpha2 import ImageDigestGetter
from tools import upgrade_artifact

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
    ("image", "ref"),
    [
        ("127.0.0.1:5000/nodetaskd/agent", ImageRef("127.0.0.1:5000", "nodetaskd/agent", "v0.2.0")),
        ("registry.example.com/agent:v0.1.0", ImageRef("registry.example.com", "agent", "v0.2.0")),
        ("localhost/agent@sha256:" + "b" * 64, ImageRef("localhost", "agent", "v0.2.0")),
        ("kubeedge/installation-package", ImageRef("registry-1.docker.io", "kubeedge/installation-package", "v0.2.0")),
        ("busybox", ImageRef("registry-1.docker.io", "library/busybox", "v0.2.0")),
    ],
)
def test_an_image_reference_gets_the_jobs_version_as_its_tag(image: str, ref: ImageRef) -> None:
    """The spec's version replaces any tag or digest in the image, and the host is found as Docker finds it."""
    assert ImageRef.parse(image, "v0.2.0") == ref


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


def test_the_artifact_tool_builds_a_reproducible_layer_of_this_project(tmp_path: Path) -> None:
    """The same tree and version give the same bytes; the layer unpacks to VERSION and the packages."""
    first, diff_id = upgrade_artifact.build_layer("v0.2.0")
    assert upgrade_artifact.build_layer("v0.2.0") == (first, diff_id)
    (tmp_path / "layer.tar.gz").write_bytes(first)
    artifact._extract(tmp_path / "layer.tar.gz", tmp_path)
    artifact._verify_tree(tmp_path, "v0.2.0")
    with pytest.raises(ArtifactError, match=r"holds version 'v0\.2\.0', not 'v0\.3\.0'"):
        artifact._verify_tree(tmp_path, "v0.3.0")
    broken, _ = upgrade_artifact.build_layer("v0.9.0", broken=True)
    with tarfile.open(fileobj=io.BytesIO(broken)) as tar:
        cli = tar.extractfile("roles/cli.py")
        assert cli is not None
        assert b"raise RuntimeError" in cli.read()
