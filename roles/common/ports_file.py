"""The file a server writes once it listens, naming the ports it bound: how whoever started it with port 0
learns them (the hub's ``portsFile``).

The file is one JSON object: the process's ``pid``, so that a reader never takes a file left by an
earlier process for this one's, and the bound address of each listening setting by its name in the
configuration, e.g. ``{"pid": 4242, "listen": "127.0.0.1:43121", "httpListen": "127.0.0.1:43122"}``.
It is replaced whole (a reader sees no half-written file) and removed when the server stops.
``tools/ports.py`` reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from roles.common.config import ConfigError
from roles.common.files import write_atomically

__all__ = ["address_text", "check_ports_file", "remove_ports_file", "write_ports_file"]

_MODE = 0o644
"""Ports are no secret: anything on the host can see what listens."""


def address_text(host: str, port: int) -> str:
    """``host:port`` as a configuration writes it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_ports_file(setting: str, path: Path) -> None:
    """Refuse, before anything is bound, a ports file that could not be written (:class:`ConfigError`)."""
    if not path.parent.is_dir():
        raise ConfigError(f"{setting} {str(path)!r}: the directory {str(path.parent)!r} does not exist")
    if path.is_dir():
        raise ConfigError(f"{setting} {str(path)!r} is a directory")


def write_ports_file(path: Path, addresses: Mapping[str, str]) -> None:
    """Write this process's pid and ``addresses`` (``host:port`` by setting name) to ``path``."""
    content = {"pid": os.getpid(), **addresses}
    write_atomically(path, json.dumps(content).encode() + b"\n", mode=_MODE)


def remove_ports_file(path: Path) -> None:
    """Remove ``path`` if it is still this process's (a server started since keeps its own)."""
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
