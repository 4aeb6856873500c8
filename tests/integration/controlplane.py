"""pytest plugin: a real kube-apiserver + etcd for the integration tests.

List it in a conftest (``pytest_plugins = ["tests.integration.controlplane"]``,
or the dotted name matching how the tests are laid out) and request the
session-scoped ``control_plane`` fixture.

Why a real apiserver: the behaviour under test (CRD status subresource,
409 on a stale resourceVersion, watches across an apiserver restart, RBAC
per identity) is exactly what fakes get wrong.  The fixture is deliberately
not optional: if kube-apiserver cannot be built or started, the tests that
need it error instead of silently skipping.

The first run on a machine builds kube-apiserver (about 5 minutes, cached in
``~/.cache/nodetaskd`` or ``$NODETASKD_CACHE``); later sessions start the
cluster in a few seconds.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    from tools.provision.controlplane import AGENT_ONLY_NODES, ControlPlane, ensure_binaries, start
except ModuleNotFoundError:  # tools/ is not installed; it lives at the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools.provision.controlplane import AGENT_ONLY_NODES, ControlPlane, ensure_binaries, start

__all__ = ["ControlPlane", "control_plane"]


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on 127.0.0.1 with RBAC from ``containers/rbac``.

    Use ``control_plane.kubeconfig("controller" | "cloud" | "edge" | "admin")``
    for a client identity, ``control_plane.kubectl(...)`` for set-up as admin,
    and ``control_plane.restart_apiserver()`` to bounce the apiserver.
    Everything is stopped (by PID) when the session ends; should pytest die
    without teardown, the kernel terminates both processes with it.
    """
    binaries = ensure_binaries()
    cp = start(tmp_path_factory.mktemp("controlplane"), binaries, node_monitor=AGENT_ONLY_NODES)
    try:
        cp.apply_rbac()
        yield cp
    finally:
        cp.stop()
