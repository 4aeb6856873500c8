"""What a user installs: the sdist and wheel ``python -m build`` makes of this tree, installed into fresh
virtualenvs as a device (the base install) and a cluster (the ``cloud`` extra) would, and run from there.

No control plane is needed; PyPI (or pip's cache) gives the dependencies, at the versions ``constraints.txt``
names. Every command runs outside the checkout with no ``PYTHONPATH``, so only the installed files answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from tools.provision.controlplane import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow(60)]

VERSION = "0.1.0"
PACKAGES = {"nodetask", "roles", "flows", "schemas"}
"""The wheel's top-level packages: tests, tools, bench, docs and containers stay in the checkout."""
CHECKOUT_ONLY = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.pyc", "build", "dist", "*.egg-info", ".*_cache", ".hypothesis", "test-logs"
)


def _run(argv: list[str | Path], *, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and wheel built from a copy of this tree (the checkout is left as it is)."""
    work = tmp_path_factory.mktemp("build")
    source = work / "source"
    shutil.copytree(REPO_ROOT, source, ignore=CHECKOUT_ONLY, symlinks=True)
    built = _run([sys.executable, "-m", "build", "--outdir", work / "dist", source], cwd=work)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return work / "dist"


def _install(where: Path, dist: Path, requirement: str) -> Path:
    """A fresh virtualenv at ``where`` with ``requirement`` (naming the built wheel) installed; its ``bin``.

    The checkout's pip installs into it (``--python``): a pip of its own would cost each environment 5 s of
    ensurepip, and nothing here runs pip from it. Nothing is byte-compiled ahead (``--no-compile``): the
    commands below import a small part of what is installed, and compile that as they do."""
    venv.create(where, with_pip=False)
    (wheel,) = dist.glob("nodetaskd-*.whl")
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", where / "bin" / "python", "install"]
    pip += ["--quiet", "--no-compile", "--disable-pip-version-check"]
    constraints = REPO_ROOT / "constraints.txt"
    installed = _run([*pip, "--constraint", constraints, f"{requirement} @ {wheel.as_uri()}"], cwd=where)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return where / "bin"


@pytest.fixture(scope="module")
def device(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` of a virtualenv holding the base install only, as on a device."""
    return _install(tmp_path_factory.mktemp("device") / "venv", dist, "nodetaskd")


@pytest.fixture(scope="module")
def cluster(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` of a virtualenv holding the ``cloud`` extra, as in the controller's and hubs' image."""
    return _install(tmp_path_factory.mktemp("cluster") / "venv", dist, "nodetaskd[cloud]")


def _kubeconfig(path: Path) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


def _check_config(bin_dir: Path, role: str, config: str, tmp_path: Path) -> dict[str, object]:
    (tmp_path / f"{role}.yaml").write_text(config)
    checked = _run([bin_dir / "nodetaskd", f"--role={role}", f"--config={role}.yaml", "--check-config"], cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    effective: dict[str, object] = json.loads(checked.stdout)
    return effective


def test_build_makes_an_sdist_and_a_wheel_of_the_four_packages_and_their_data(dist: Path) -> None:
    """The wheel holds nodetask, roles, flows and schemas with the CRDs, the unit file and the licence; the sdist
    also the changelog and the constraints; the metadata gives ranges, never exact pins."""
    (wheel,) = dist.glob(f"nodetaskd-{VERSION}-py3-none-any.whl")
    (sdist,) = dist.glob(f"nodetaskd-{VERSION}.tar.gz")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"nodetaskd-{VERSION}.dist-info/METADATA").decode()
    assert {name.split("/")[0] for name in names} == {*PACKAGES, f"nodetaskd-{VERSION}.dist-info"}
    assert {
        "schemas/crds/operations.kubeedge.io_nodeupgradejobs.yaml",
        "schemas/crds/diagnosis.kubediag.org_diagnoses.yaml",
        "roles/systemd/nodetaskd-edge.service",
        "roles/edge/runtime/cri_pb/api_pb2.py",
        f"nodetaskd-{VERSION}.dist-info/licenses/LICENSE",
    } <= names
    requirements = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "Requires-Dist: trio<0.36,>=0.35" in requirements
    assert not [r for r in requirements if "==" in r.partition(";")[0]]
    with tarfile.open(sdist) as archive:
        top = {Path(name).relative_to(f"nodetaskd-{VERSION}").as_posix() for name in archive.getnames()}
    assert {"LICENSE", "CHANGELOG.md", "constraints.txt", "README.md", "pyproject.toml"} <= top


def test_the_base_install_runs_the_edge_role_and_asks_for_the_cloud_extra_for_the_others(
    device: Path, tmp_path: Path
) -> None:
    """On a device's install, --version and the edge's --check-config answer from the installed files; the
    controller, whose extra is missing, ends with exit 3 naming the extra."""
    version = _run([device / "nodetaskd", "--version"], cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, f"nodetaskd {VERSION}\n")
    where = _run([device / "python", "-c", "import roles; print(roles.__file__)"], cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(device.parent), where.stdout
    (tmp_path / "token").write_text("t0ken\n")
    edge = _check_config(
        device,
        "edge",
        f"nodeName: edge-1\nhubUrls: [wss://hub.example.com:10004]\ntokenFile: {tmp_path / 'token'}\n"
        f"dataDir: {tmp_path / 'data'}\n",
        tmp_path,
    )
    assert (edge["nodeName"], edge["hubUrls"]) == ("edge-1", ["wss://hub.example.com:10004"])
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig")
    controller = _run([device / "nodetaskd", "--role=controller", f"--kubeconfig={kubeconfig}"], cwd=tmp_path)
    assert controller.returncode == 3, controller.stderr
    assert "needs the cloud extra (pip install 'nodetaskd[cloud]')" in controller.stderr


def test_the_cloud_install_checks_the_controller_and_hub_configurations(cluster: Path, tmp_path: Path) -> None:
    """With the cloud extra, --version and the controller's and the hub's --check-config answer from the
    installed files."""
    version = _run([cluster / "nodetaskd", "--version"], cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, f"nodetaskd {VERSION}\n")
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig")
    controller = _check_config(cluster, "controller", f"kubeconfig: {kubeconfig}\nidentity: controller-0\n", tmp_path)
    assert (controller["kubeconfig"], controller["identity"]) == (str(kubeconfig), "controller-0")
    hub = _check_config(cluster, "cloud", f"kubeconfig: {kubeconfig}\nhubId: hub-0\nlisten: 0.0.0.0:10004\n", tmp_path)
    assert (hub["hubId"], hub["listen"]) == ("hub-0", "0.0.0.0:10004")
    imported = _run([cluster / "python", "-c", "import roles.controller.role, roles.cloud.role"], cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
