"""Integration fixtures: CRDs applied to the real control plane, and clients per role identity."""

from __future__ import annotations

from collections.abc import AsyncIterator
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
