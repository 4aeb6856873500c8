"""Integration fixtures: CRDs applied to the real control plane, clients per role identity, a hanging registry."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog

from roles.kube import Kube, open_kube
from tests.integration.controlplane import ControlPlane

CRD_DIR = Path(__file__).resolve().parents[2] / "schemas" / "crds"


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
