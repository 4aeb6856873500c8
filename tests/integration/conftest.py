"""Integration fixtures: CRDs applied to the real control plane, clients per role identity, a hanging registry;
and the role processes' logs of a failed test, kept."""

from __future__ import annotations

import os
import re
import shutil
import socket
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
import structlog

from roles.kube import Kube, open_kube
from tests.integration.controlplane import ControlPlane

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "schemas" / "crds"
KEPT_LOGS = Path(os.environ.get("NODETASKD_TEST_LOGS", REPO / "test-logs"))
"""Where the logs of a failed test's processes are copied (pytest keeps only its last three temporary trees,
and a CI clone none)."""
TAIL_LINES = 60
LOGS_PER_TEST = 24


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's role logs (``*.log`` under its ``tmp_path``): copied to :data:`KEPT_LOGS`, and
    their last lines added to the report, so that the failure's output says what each process saw."""
    report = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and isinstance(tmp_path, Path):
        _keep_logs(report, tmp_path, item.nodeid)
    return report


def _keep_logs(report: pytest.TestReport, tmp_path: Path, nodeid: str) -> None:
    # Regular files only: a real node's log directories hold symlinks to its containers' logs, dangling
    # once the node has stopped.
    logs = sorted(p for p in tmp_path.rglob("*.log") if p.is_file() and not p.is_symlink())[:LOGS_PER_TEST]
    kept = KEPT_LOGS / re.sub(r"[^\w.-]+", "_", nodeid)[-120:]
    shutil.rmtree(kept, ignore_errors=True)  # an earlier failure's logs would read as this one's
    for log in logs:
        relative = log.relative_to(tmp_path)
        target = kept / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(log, target)
            lines = log.read_bytes().decode(errors="replace").splitlines()[-TAIL_LINES:]
        except OSError as exc:  # gone meanwhile, or unreadable: say so instead of ending the session
            lines = [f"(not kept: {exc})"]
        report.sections.append((f"log {relative} (last {len(lines)} lines; all of it in {target})", "\n".join(lines)))


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The generated CRDs, applied and established."""
    control_plane.kubectl("apply", "-f", str(CRD_DIR))
    control_plane.kubectl("wait", "--for=condition=established", "--timeout=60s", "-f", str(CRD_DIR))
    return control_plane


@pytest.fixture
async def controller_kube(crds: ControlPlane) -> AsyncIterator[Kube]:
    """A client authenticated as the controller role."""
    async with open_kube(kubeconfig=str(crds.kubeconfig("controller")), log=structlog.get_logger()) as kube:
        yield kube


@pytest.fixture
async def cloud_kube(crds: ControlPlane) -> AsyncIterator[Kube]:
    """A client authenticated as the cloud role."""
    async with open_kube(kubeconfig=str(crds.kubeconfig("cloud")), log=structlog.get_logger()) as kube:
        yield kube


@pytest.fixture
def black_hole() -> Iterator[str]:
    """host:port of a listener that accepts connections and never answers (a registry that hangs)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"127.0.0.1:{sock.getsockname()[1]}"
