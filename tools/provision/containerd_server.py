"""A real containerd with its CRI plugin, everything under one state directory (:mod:`tools.provision.containerd`
says why and how it is used). Stdlib only."""

from __future__ import annotations

import contextlib
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tools.provision import controlplane as _cp
from tools.provision.runtime_processes import (
    Process,
    RuntimeServicesError,
    Tools,
    ensure_tools,
    prepare_dir,
    spawn,
    wait_until,
)

SOCKET_PATH_MAX: Final = 107
"""Longest unix socket path Linux accepts (``sun_path`` is 108 bytes with the NUL)."""

# Snapshotters that need kernel features or tools a test container lacks; loading them only adds
# errors to the log. The CRI plugin is told to use "native".
_DISABLED_PLUGINS: Final = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.overlayfs",
    "io.containerd.snapshotter.v1.zfs",
)


@dataclass
class Containerd:
    """A running containerd whose CRI plugin serves on :attr:`endpoint`."""

    state_dir: Path
    socket: Path
    process: Process

    @property
    def endpoint(self) -> str:
        """The CRI endpoint, as the kubelet and KubeEdge spell it: ``unix:///…/containerd.sock``."""
        return f"unix://{self.socket}"

    @property
    def hosts_dir(self) -> Path:
        """The CRI plugin's ``config_path``: one ``<host[:port]>/hosts.toml`` per configured registry."""
        return self.state_dir / "certs.d"

    def allow_plain_http(self, host: str) -> None:
        """Make the CRI plugin reach registry ``host`` (``127.0.0.1:PORT``) over plain HTTP.

        containerd reads the hosts directory at every pull, so no restart is needed.
        """
        directory = self.hosts_dir / host
        directory.mkdir(parents=True, exist_ok=True)
        _cp._write_atomic(
            directory / "hosts.toml",
            f'server = "http://{host}"\n\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n',
        )

    def alive(self) -> bool:
        return self.process.alive()

    def stop(self) -> None:
        """Stop containerd (by PID). Idempotent."""
        self.process.stop()


def _containerd_config(state_dir: Path, sock: Path) -> str:
    # TOML basic strings are JSON-compatible for these paths, so json.dumps quotes them safely.
    def q(value: object) -> str:
        return json.dumps(str(value))

    disabled = ", ".join(q(p) for p in _DISABLED_PLUGINS)
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f"root = {q(state_dir / 'root')}",
            f"state = {q(state_dir / 'state')}",
            f"disabled_plugins = [{disabled}]",
            "[grpc]",
            f"  address = {q(sock)}",
            "[ttrpc]",
            f"  address = {q(str(sock) + '.ttrpc')}",
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {q(state_dir / 'opt')}",
            f"{cri}]",
            # Never pulled (no pod is run); a loopback name keeps anything from reaching the internet.
            '  sandbox_image = "127.0.0.1:1/pause:none"',
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            f"{cri}.containerd]",
            '  snapshotter = "native"',
            f"{cri}.cni]",
            f"  bin_dir = {q(state_dir / 'cni' / 'bin')}",
            f"  conf_dir = {q(state_dir / 'cni' / 'conf')}",
            f"{cri}.registry]",
            f"  config_path = {q(state_dir / 'certs.d')}",
            "",
        ]
    )


def start_containerd(state_dir: Path, tools: Tools | None = None, *, detach: bool = False) -> Containerd:
    """Start containerd with everything in ``state_dir`` (created, or empty); return once it serves.

    With ``detach=False`` (tests) the kernel also terminates it if the calling process dies
    without :meth:`Containerd.stop`; ``detach=True`` (the CLI's ``up``) lets it outlive the caller.
    """
    tools = tools or ensure_tools()
    state_dir = prepare_dir(state_dir)
    sock = state_dir / "containerd.sock"
    if len(str(sock)) + len(".ttrpc") > SOCKET_PATH_MAX:
        raise RuntimeServicesError(f"socket path {sock}.ttrpc is longer than {SOCKET_PATH_MAX} bytes")
    for sub in ("certs.d", "cni/bin", "cni/conf", "opt"):
        (state_dir / sub).mkdir(parents=True)
    config = state_dir / "config.toml"
    _cp._write_atomic(config, _containerd_config(state_dir, sock))
    log = state_dir / "containerd.log"
    process = spawn(
        "containerd",
        [str(tools.containerd), "--config", str(config)],
        log=log,
        marker=str(config),
        detach=detach,
    )
    ctd = Containerd(state_dir=state_dir, socket=sock, process=process)
    try:
        wait_until("containerd", process, lambda: _booted(log) and _accepts(sock))
    except BaseException:
        with contextlib.suppress(RuntimeServicesError):
            ctd.stop()
        raise
    return ctd


def _booted(log: Path) -> bool:
    # The CRI service is registered before containerd logs this line.
    return "containerd successfully booted" in log.read_text(errors="replace")


def _accepts(sock: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


__all__ = ["SOCKET_PATH_MAX", "Containerd", "start_containerd"]
