"""The controller's and hubs' image, built without a container engine, pushed to a real registry, and run.

No container runtime can run it here (no pull from Docker Hub, no runc sandbox), so the image's
root file system is unpacked with umoci and its entry point run with chroot, as the user the
image's configuration names: that is what a runtime does, short of namespaces and cgroups.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.provision import containerd as ctd
from tools.provision import image, image_layout, image_tools

pytestmark = pytest.mark.integration

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def image_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ctd.Registry]:
    """A registry of its own (no containerd needed), stopped after the module."""
    reg = ctd.start_registry(tmp_path_factory.mktemp("image-registry"))
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="module")
def pushed(image_registry: ctd.Registry, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The OCI layout built here and what the push printed (``host/repo@digest``)."""
    layout = tmp_path_factory.mktemp("layout") / "oci"
    return layout, image.build_and_push(f"{image_registry.host}/nodetaskd:0.1.0", layout=layout)


def _registry_json(url: str) -> dict[str, object]:
    request = urllib.request.Request(url, headers={"Accept": OCI_MANIFEST})
    with urllib.request.urlopen(request, timeout=10) as answer:
        loaded: dict[str, object] = json.loads(answer.read())
        return loaded


def test_the_registry_serves_the_built_image_under_the_printed_digest(
    image_registry: ctd.Registry, pushed: tuple[Path, str]
) -> None:
    """The tag and the printed digest name the manifest built in the layout, with its three layers."""
    layout, reference = pushed
    repository, _, digest = reference.partition("@")
    assert repository == f"{image_registry.host}/nodetaskd"
    assert digest == image_layout.manifest_digest(layout, "0.1.0")
    by_tag = _registry_json(f"http://{image_registry.host}/v2/nodetaskd/manifests/0.1.0")
    by_digest = _registry_json(f"http://{image_registry.host}/v2/nodetaskd/manifests/{digest}")
    assert by_tag == by_digest
    layers = by_digest["layers"]
    assert isinstance(layers, list)
    assert len(layers) == 3  # Debian's python, the cloud extra's wheels, nodetaskd


def test_the_image_runs_nodetaskd_as_its_non_root_user_with_the_cloud_extra_only(
    pushed: tuple[Path, str], tmp_path: Path
) -> None:
    """Unpacked, the image's entry point runs as uid 65532, loads both cloud roles and has no rich."""
    layout, _ = pushed
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:0.1.0", str(bundle)], check=True, capture_output=True)
    spec = json.loads((bundle / "config.json").read_text())
    user, args, cwd = spec["process"]["user"], spec["process"]["args"], spec["process"]["cwd"]
    assert (user["uid"], user["gid"]) == (65532, 65532)
    assert args == ["/usr/local/bin/nodetaskd"]
    rootfs = str(bundle / "rootfs")
    home = (bundle / "rootfs" / cwd.lstrip("/")).stat()
    assert (cwd, home.st_uid, home.st_mode & 0o777) == ("/var/lib/nodetaskd", 65532, 0o700)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        command = ["chroot", f"--userspec={user['uid']}:{user['gid']}", rootfs, *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    checked = run(*args, "--role=cloud", "--listen=0.0.0.0:10004", "--check-config")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["listen"] == "0.0.0.0:10004"
    probe = (
        "import os, roles.controller, roles.cloud\n"
        "print(os.getuid())\n"
        "try:\n    import rich\nexcept ModuleNotFoundError:\n    print('no rich')\n"
        "try:\n    open('/usr/local/bin/x', 'w')\nexcept PermissionError:\n    print('read-only for the user')\n"
    )
    imported = run("/usr/bin/python3", "-c", probe)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.split("\n")[:3] == ["65532", "no rich", "read-only for the user"]


def test_the_same_tree_builds_the_same_digest(pushed: tuple[Path, str], tmp_path: Path) -> None:
    """A second build of the same tree, into another layout, gives the same manifest digest."""
    layout, reference = pushed
    again = image_layout.build(tmp_path / "oci", "0.1.0", tools=image_tools.ensure_tools())
    assert again == reference.partition("@")[2] == image_layout.manifest_digest(layout, "0.1.0")
