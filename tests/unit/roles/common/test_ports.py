"""Ports for the servers tests, benchmarks and the demo start: picked below the ephemeral range, held while a
server is down, or read from the file a server on port 0 writes once it listens."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from roles.common.ports_file import remove_ports_file, write_ports_file
from tools.ports import LOOPBACK, ephemeral_floor, free_ports, held, reported


def test_picked_ports_are_distinct_free_and_below_the_range_the_kernel_hands_out_itself() -> None:
    """No outgoing connection can take a picked port before its server binds it, and each can be bound."""
    ports = free_ports(6)
    assert len(set(ports)) == 6
    assert all(port < ephemeral_floor() for port in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind((LOOPBACK, port))


def test_a_held_port_refuses_connections_and_other_binds_until_its_server_comes_back() -> None:
    """While held, a connection is refused (as by a stopped server) and a plain bind fails; a server binding with
    SO_REUSEADDR, as the hub's and trio's listeners do, takes the port and serves on it."""
    with held() as port:
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect((LOOPBACK, port))
        with socket.socket() as other, pytest.raises(OSError, match=os.strerror(errno.EADDRINUSE)):
            other.bind((LOOPBACK, port))

        async def comes_back() -> None:
            listeners = await trio.open_tcp_listeners(port, host=LOOPBACK)
            async with listeners[0], await trio.open_tcp_stream(LOOPBACK, port):
                pass

        trio.run(comes_back)


def test_a_held_port_can_be_a_given_one_a_stopped_server_left() -> None:
    """``held(port)`` keeps the very port a server listened on, once that server has stopped."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((LOOPBACK, 0))
        server.listen()
        port = server.getsockname()[1]
    with held(port) as kept:
        assert kept == port


def test_reported_ports_are_the_ones_this_process_wrote_and_none_from_another(tmp_path: Path) -> None:
    """The reader gets each setting's port from the server's file, and nothing from a file another process left
    (an earlier hub's), from a missing file or from one that is not JSON."""
    path = tmp_path / "hub.ports.json"
    assert reported(path, pid=os.getpid()) is None
    write_ports_file(path, {"listen": "127.0.0.1:43121", "httpListen": "[::1]:43122"})
    assert reported(path, pid=os.getpid()) == {"listen": 43121, "httpListen": 43122}
    assert reported(path, pid=os.getpid() + 1) is None
    path.write_text("{not json")
    assert reported(path, pid=os.getpid()) is None


def test_a_server_removes_its_ports_file_but_not_one_a_later_server_wrote(tmp_path: Path) -> None:
    """On stopping, the file goes only if it still names this process: a hub started since keeps its own."""
    path = tmp_path / "hub.ports.json"
    write_ports_file(path, {"listen": "127.0.0.1:43121"})
    remove_ports_file(path)
    assert not path.exists()
    path.write_text(json.dumps({"pid": os.getpid() + 1, "listen": "127.0.0.1:43121"}))
    remove_ports_file(path)
    assert path.exists()


def test_a_hub_whose_ports_file_cannot_be_written_exits_2_before_binding(tmp_path: Path) -> None:
    """A portsFile in a directory that does not exist ends the hub at start with one line naming the setting."""
    missing = tmp_path / "absent" / "hub.ports.json"
    cfg = tmp_path / "cloud.yaml"
    cfg.write_text(f"listen: 127.0.0.1:0\nhttpListen: 127.0.0.1:0\nportsFile: {missing}\n")
    command = [sys.executable, "-m", "roles.cli", "--role=cloud", f"--config={cfg}", "--kubeconfig=/nonexistent"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.endswith(f"portsFile '{missing}': the directory '{missing.parent}' does not exist\n")
    assert done.stderr.count("\n") == 1
