"""The test nodes' answer to the kubelet's Docker question gives cAdvisor its fallback root and a version it refuses."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.provision import docker_info
from tools.provision.node_config import Layout, kubelet_flags

SCRIPT = Path(docker_info.__file__)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=5)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(self._path))


def _get(path: Path, url: str) -> tuple[int, Any]:
    connection = _UnixConnection(path)
    try:
        connection.request("GET", url)
        answer = connection.getresponse()
        body = answer.read()
        return answer.status, json.loads(body) if answer.getheader("Content-Type") == "application/json" else body
    finally:
        connection.close()


@pytest.fixture
def answering(tmp_path: Path) -> Iterator[Path]:
    """The script running as a node runs it, on a socket in ``tmp_path`` (a stale file there first)."""
    path = tmp_path / "docker-info.sock"
    path.write_text("left by a power cut")
    process = subprocess.Popen([sys.executable, str(SCRIPT), str(path)], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        assert b"answering on" in process.stdout.readline()
        yield path
    finally:
        process.kill()
        process.wait()


def test_info_names_the_root_cadvisor_falls_back_to_and_a_version_below_its_minimum(answering: Path) -> None:
    """``info`` (under any API version prefix) says /var/lib/docker and version 0.0.0; ``version`` agrees."""
    status, info = _get(answering, "/v1.40/info")
    assert status == 200
    assert info["DockerRootDir"] == "/var/lib/docker"
    assert int(info["ServerVersion"].split(".")[0]) < 1
    status, version = _get(answering, "/version")
    assert (status, version["Version"]) == (200, info["ServerVersion"])
    assert _get(answering, "/_ping") == (200, b"OK")


def test_anything_else_is_not_found_and_says_why(answering: Path) -> None:
    """A container list is no question it answers: 404 with a message saying what it is."""
    status, body = _get(answering, "/v1.40/containers/json")
    assert status == 404
    assert "not Docker" in body["message"]
    assert _get(answering, "/info")[0] == 200  # still answering after a refusal


def test_a_nodes_kubelet_asks_its_own_socket(tmp_path: Path) -> None:
    """The kubelet's ``--docker`` names the socket in the node's short directory, one per node."""
    layouts = [Layout(tmp_path / "a"), Layout(tmp_path / "b")]
    argvs = [
        kubelet_flags(Path("kubelet"), name="n", kubeconfig=Path("k"), layout=lay, labels={}, extra=())
        for lay in layouts
    ]
    sockets = [next(flag for flag in argv if flag.startswith("--docker=")) for argv in argvs]
    assert sockets == [f"--docker=unix://{lay.docker_info_socket}" for lay in layouts]
    assert layouts[0].docker_info_socket != layouts[1].docker_info_socket
