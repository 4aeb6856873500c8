#!/usr/bin/env python3
"""A real containerd (with its CRI plugin) and real OCI registries on loopback, for tests and the demo.

Why this exists: the edge pulls images through the CRI ImageService of the node's container
runtime, and what matters (field numbers on the wire, a 401 without credentials, NOT_FOUND for a
missing tag, plain HTTP to a local registry, cancelling a pull) is exactly what a fake would get
wrong. So tests and the demo run a genuine containerd and genuine ``docker-registry`` processes,
each owned (by PID) by whoever started them, everything in one temporary directory:

- containerd (Debian ``containerd``): root, state, socket and the CRI plugin's registry host
  configuration under the state directory, the ``native`` snapshotter (works in any container, no
  overlay mounts), no TCP listener but the CRI streaming server on 127.0.0.1 with a free port, so a
  system containerd (``/run/containerd``) is never touched;
- registries (Debian ``docker-registry``, distribution v2) on ``127.0.0.1:<free port>``, storage in
  the state directory; optionally with htpasswd basic auth (bcrypt, the only hash it accepts,
  made with ``htpasswd -B`` from ``apache2-utils``), or with bearer-token auth (``auth: token``,
  the exchange Docker Hub uses; :class:`TokenAuth` names the token service, which the caller
  runs). containerd reaches them over plain HTTP through
  a ``hosts.toml`` per registry (:meth:`Containerd.allow_plain_http`);
- test images are built from nothing with ``umoci`` and pushed with ``skopeo``: one small layer
  holding a unique file, so every pushed image has its own digest.

Missing Debian packages are installed with apt-get (as root). This file is stdlib-only on purpose
(like ``tools/provision/controlplane.py``, whose process helpers it shares), so the CLI runs without the
virtualenv; the pytest fixtures at the end are defined only where pytest is importable. Usage::

    python3 tools/provision/containerd.py up        # containerd + an open and an authenticated registry
    python3 tools/provision/containerd.py push demo/app:v1 [--auth]
    python3 tools/provision/containerd.py status
    python3 tools/provision/containerd.py env       # shell exports for the running services
    python3 tools/provision/containerd.py down

As a pytest plugin (``pytest_plugins = [..., "tools.provision.containerd"]``) it provides the session
fixtures ``containerd``, ``registry`` and ``auth_registry``.

This module is the command, the fixtures and the names to import; containerd is started in
:mod:`tools.provision.containerd_server`, the registries in :mod:`tools.provision.registry`, what both
share (the tools, the server processes) is in :mod:`tools.provision.runtime_processes` and the command
line in :mod:`tools.provision.runtime_cli`.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

try:
    from tools.provision.runtime_cli import default_state_dir, main
except ModuleNotFoundError:  # run as a script: tools/provision/ is on sys.path, the repository root is not
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools.provision.runtime_cli import default_state_dir, main
from tools.provision.containerd_server import Containerd, start_containerd
from tools.provision.registry import Registry, TokenAuth, start_registry
from tools.provision.runtime_processes import READY_TIMEOUT, RuntimeServicesError, Tools, ensure_tools

# --------------------------------------------------------------------------
# pytest plugin
# --------------------------------------------------------------------------

try:
    import pytest
except ModuleNotFoundError:  # the CLI runs without the virtualenv; only the fixtures need pytest
    pass
else:

    @pytest.fixture(scope="session")
    def runtime_tools() -> Tools:
        """The Debian tools, installed on first use (containerd, docker-registry, skopeo, umoci, htpasswd)."""
        return ensure_tools()

    @pytest.fixture(scope="session")
    def containerd(tmp_path_factory: pytest.TempPathFactory, runtime_tools: Tools) -> Iterator[Containerd]:
        """A containerd with its CRI plugin at ``containerd.endpoint``, stopped (by PID) after the session."""
        ctd = start_containerd(tmp_path_factory.mktemp("containerd"), runtime_tools)
        try:
            yield ctd
        finally:
            ctd.stop()

    @pytest.fixture(scope="session")
    def registry(
        tmp_path_factory: pytest.TempPathFactory, runtime_tools: Tools, containerd: Containerd
    ) -> Iterator[Registry]:
        """An open registry on 127.0.0.1 that ``containerd`` pulls from over plain HTTP."""
        reg = start_registry(tmp_path_factory.mktemp("registry"), runtime_tools)
        try:
            containerd.allow_plain_http(reg.host)
            yield reg
        finally:
            reg.stop()

    @pytest.fixture(scope="session")
    def auth_registry(
        tmp_path_factory: pytest.TempPathFactory, runtime_tools: Tools, containerd: Containerd
    ) -> Iterator[Registry]:
        """A registry that needs basic auth (``.username``/``.password``), reachable by ``containerd``."""
        reg = start_registry(
            tmp_path_factory.mktemp("auth-registry"),
            runtime_tools,
            credentials=("nodetaskd", secrets.token_urlsafe(12)),
        )
        try:
            containerd.allow_plain_http(reg.host)
            yield reg
        finally:
            reg.stop()


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "READY_TIMEOUT",
    "Containerd",
    "Registry",
    "RuntimeServicesError",
    "TokenAuth",
    "Tools",
    "default_state_dir",
    "ensure_tools",
    "main",
    "start_containerd",
    "start_registry",
]
