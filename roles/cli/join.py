"""``nodetaskd edge join``: install the edge agent on a device.

Join writes, under a root (``/`` on a device, a temporary directory in tests), everything the agent
needs to start under systemd: the node's token and the hubs' CA (copied, private), the configuration
``etc/nodetaskd/edge.yaml`` naming them, the data directory ``var/lib/nodetaskd`` (0700) and the unit
``etc/systemd/system/nodetaskd-edge.service`` (:mod:`roles.cli.systemd_unit`). Everything is checked
before anything is written (the node name, the hub URLs, the token, the CA), each file is written
atomically, and a record of what was created (``etc/nodetaskd/join.json``, written first,
:mod:`roles.cli.join_layout`) lets reset (:mod:`roles.cli.reset`) remove exactly that, even after a
join that failed half-way. Base install only: this runs on the device.

Security defaults: a hub URL must be ``wss://`` (the token crosses the network), unless
``--allow-plain-ws``; an existing join is never overwritten without ``--force``. The token and CA
files must be regular files of a bounded size (a FIFO would hang the join, ``/dev/zero`` fill its
memory), and the token must look like one (:mod:`roles.cli.token_format`), so that no other file is
installed and sent to the hubs as the node's token. The root may hold no control characters, and
the paths written into the unit are quoted by systemd's rules, so no path can add a line to it.
"""

from __future__ import annotations

import os
import re
import ssl
import stat
import sys
from pathlib import Path
from typing import Final, Protocol

import msgspec

from roles.cli.join_layout import JoinError, JoinRecord, Layout, load_record
from roles.cli.systemd_unit import path_problem, render_unit, unit_template
from roles.cli.token_format import token_problem
from roles.common.config import EdgeConfig
from roles.common.files import write_atomically

__all__ = ["HubProbe", "join"]


class HubProbe(Protocol):
    """Asks the hubs about the node's token and the CA; a line per hub, or :class:`JoinError`."""

    def __call__(self, hubs: tuple[str, ...], *, node: str, token: str, ca: str | None) -> list[str]: ...


MAX_TOKEN_FILE_BYTES: Final = 4096
"""A token file holds one line of at most 1,024 characters (``roles.cli.token_format``); anything larger is not one."""
MAX_CA_FILE_BYTES: Final = 1 << 20
"""A CA bundle of a few hundred certificates; a file larger than this is not the hubs' CA."""
_PEM_CERTIFICATE: Final = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def _check_hubs(hubs: tuple[str, ...], *, allow_plain_ws: bool) -> None:
    if not hubs:
        raise JoinError("--hub is required: the wss:// URL of the cloud hubs (repeat it for several)")
    for url in hubs:
        if url.startswith("ws://") and not allow_plain_ws:
            raise JoinError(
                f"hub {url} is plain ws://: the node's token would cross the network unencrypted;"
                " use wss:// (or --allow-plain-ws on a network you trust)"
            )


def _kind(mode: int) -> str:
    kinds = {
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISDIR: "a directory",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def _read_input(path: Path, what: str, limit: int) -> bytes:
    """The content of the regular file ``path`` (``what`` names it in errors), at most ``limit`` bytes.

    Opened without blocking (a FIFO with no writer would otherwise hang here) and looked at before
    a byte is read, so that a device, FIFO or directory is refused however much it could give.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise JoinError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise JoinError(f"{what} {path} is {_kind(info.st_mode)}: give a regular file")
        if info.st_size > limit:
            raise JoinError(f"{what} {path} is {info.st_size} bytes; it cannot be more than {limit}")
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(limit + 1)
    except OSError as exc:
        raise JoinError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after it was looked at
        raise JoinError(f"{what} {path} is more than {limit} bytes")
    return data


def _read_token(path: Path) -> bytes:
    data = _read_input(path, "the token file", MAX_TOKEN_FILE_BYTES)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise JoinError(
            f"the token file {path} does not hold a node token: it holds bytes that are not ASCII"
        ) from None
    if token == "":
        raise JoinError(f"the token file {path} is empty (`nodetaskd token create NODE` writes one)")
    if problem := token_problem(token):
        raise JoinError(f"the token file {path} does not hold a node token: it {problem} (`token create` writes one)")
    return f"{token}\n".encode()


def _read_ca(path: Path) -> tuple[bytes, str]:
    """The CA file's content, once its certificates load (copied whole, as the agent's TLS reads the copy), and
    its certificates as PEM text."""
    data = _read_input(path, "the CA file", MAX_CA_FILE_BYTES)
    # Only the certificate blocks are checked (a bundle's comments may be in any script): the
    # ssl module takes PEM from memory only as ASCII text.
    blocks = _PEM_CERTIFICATE.findall(data)
    try:
        if not blocks:
            raise ValueError("no certificate block")
        pem = b"\n".join(blocks).decode("ascii")
        ssl.create_default_context(cadata=pem)
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise JoinError(f"the CA file {path} holds no usable PEM certificate ({reason})") from None
    return data, pem


def _checked_root(root: Path) -> Path:
    """``root`` as an absolute path with its links resolved; refused if a path under it cannot go into the unit."""
    if problem := path_problem(str(root)):
        raise JoinError(f"--root {str(root)!r} {problem}")
    return root.resolve()


def join(
    *,
    root: Path,
    node: str,
    hubs: tuple[str, ...],
    token_file: Path,
    ca_file: Path | None = None,
    python: str = sys.executable,
    force: bool = False,
    allow_plain_ws: bool = False,
    probe: HubProbe | None = None,
) -> list[str]:
    """Install the agent's files for ``node`` under ``root``; returns what was done, a line each.

    ``probe`` (``roles.cli.join_probe``) asks the hubs whether they take the token over TLS checked with the
    CA, once everything local is checked; its lines come first. Errors: :class:`JoinError` naming the bad
    input, the existing join or what the hubs refused, before anything is written.
    """
    layout = Layout(_checked_root(root))
    _check_hubs(hubs, allow_plain_ws=allow_plain_ws)
    token = _read_token(token_file)
    ca, ca_pem = _read_ca(ca_file) if ca_file is not None else (None, None)
    config: dict[str, object] = {
        "nodeName": node,
        "hubUrls": list(hubs),
        "tokenFile": str(layout.token),
        "dataDir": str(layout.data_dir),
    }
    if ca is not None:
        config["caFile"] = str(layout.ca)
    try:
        msgspec.convert(config, type=EdgeConfig)  # the agent's own rules, before anything is written
    except msgspec.ValidationError as exc:
        raise JoinError(f"the edge configuration would be invalid: {exc}") from None
    if (layout.record.exists() or layout.config.exists()) and not force:
        raise JoinError(
            f"{layout.root} already has an edge configuration ({layout.config}): run `nodetaskd edge reset` first,"
            " or give --force to overwrite it (the data directory is kept)"
        )
    unit = render_unit(unit_template(), python=python, config=layout.config, data_dir=layout.data_dir)
    done: list[str] = []
    if probe is not None:
        done += probe(hubs, node=node, token=token.decode("ascii").strip(), ca=ca_pem)

    files = [layout.config, layout.token, layout.unit, *([layout.ca] if ca is not None else [])]
    created = [d for d in (layout.config_dir, layout.data_dir) if not d.exists()]
    parents = [d for d in layout.parents if not d.exists()]
    previous = load_record(layout) if force else None
    record = JoinRecord(
        node=node,
        files=tuple(sorted({str(f) for f in files} | set(previous.files if previous else ()))),
        directories=tuple(sorted({str(d) for d in created} | set(previous.directories if previous else ()))),
        parents=tuple(sorted({str(d) for d in parents} | set(previous.parents if previous else ()))),
    )
    layout.config_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(layout.record, msgspec.json.format(msgspec.json.encode(record)) + b"\n", mode=0o600)
    write_atomically(layout.token, token, mode=0o600)
    done.append(f"wrote the node's token to {layout.token} (0600)")
    if ca is not None:
        write_atomically(layout.ca, ca, mode=0o644)
        done.append(f"wrote the hubs' CA to {layout.ca}")
    layout.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    layout.data_dir.chmod(0o700)
    done.append(f"created the data directory {layout.data_dir} (0700)")
    write_atomically(layout.config, msgspec.yaml.encode(config), mode=0o600)
    done.append(f"wrote the agent's configuration to {layout.config} (node {node}, hubs {', '.join(hubs)})")
    layout.unit.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(layout.unit, unit.encode(), mode=0o644)
    done.append(f"wrote the systemd unit {layout.unit} (ExecStart: {python} -m roles.edge.launcher)")
    done.append("start it: systemctl daemon-reload && systemctl enable --now nodetaskd-edge")
    return done
