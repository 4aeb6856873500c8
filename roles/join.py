"""``nodetaskd edge join`` and ``nodetaskd edge reset``: install the edge agent on a device, and undo it.

Join writes, under a root (``/`` on a device, a temporary directory in tests), everything the agent
needs to start under systemd: the node's token and the hubs' CA (copied, private), the configuration
``etc/nodetaskd/edge.yaml`` naming them, the data directory ``var/lib/nodetaskd`` (0700) and the unit
``etc/systemd/system/nodetaskd-edge.service``, rendered from the packaged one
(``roles/systemd/nodetaskd-edge.service``, also ``containers/systemd/``) with this installation's
interpreter and those paths. Everything is checked before anything is written (the node name, the
hub URLs, the token, the CA), each file is written atomically, and a record of what was created
(``etc/nodetaskd/join.json``, written first) lets reset remove exactly that, even after a join
that failed half-way. Base install only: this runs on the device.

Security defaults: a hub URL must be ``wss://`` (the token crosses the network), unless
``--allow-plain-ws``; an existing join is never overwritten without ``--force``.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

import msgspec

from roles.config import EdgeConfig
from roles.edge.control import control_socket
from roles.files import write_atomically

__all__ = ["JoinError", "Layout", "join", "render_unit", "reset"]

UNIT_NAME: Final = "nodetaskd-edge.service"
DEFAULT_DATA_DIR: Final = "/var/lib/nodetaskd"


class JoinError(ValueError):
    """The join or reset cannot go ahead; the message names what is wrong and what would allow it."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where join puts each file under ``root``."""

    root: Path

    @property
    def config_dir(self) -> Path:
        return self.root / "etc" / "nodetaskd"

    @property
    def config(self) -> Path:
        return self.config_dir / "edge.yaml"

    @property
    def token(self) -> Path:
        return self.config_dir / "token"

    @property
    def ca(self) -> Path:
        return self.config_dir / "ca.crt"

    @property
    def record(self) -> Path:
        return self.config_dir / "join.json"

    @property
    def data_dir(self) -> Path:
        return self.root / DEFAULT_DATA_DIR.lstrip("/")

    @property
    def unit(self) -> Path:
        return self.root / "etc" / "systemd" / "system" / UNIT_NAME


class JoinRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What a join created: reset removes these and nothing else."""

    node: str
    files: tuple[str, ...]
    directories: tuple[str, ...] = ()
    """Created by the join, removed whole by reset (the data directory holds the agent's store)."""
    parents: tuple[str, ...] = ()
    """Directories above those that the join created; reset removes them when they are empty."""


def render_unit(template: str, *, python: str, config: Path, data_dir: Path) -> str:
    """The packaged unit with this installation's interpreter, configuration and data directory.

    ``StateDirectory`` (which makes systemd create ``/var/lib/nodetaskd``) stays only when the data
    directory is that one.
    """
    lines = []
    for line in template.splitlines():
        if line.startswith("ExecStart="):
            lines.append(f"ExecStart={python} -m roles.edge.launcher --config {config}")
        elif line.startswith("WorkingDirectory="):
            lines.append(f"WorkingDirectory={data_dir}")
        elif not (line.startswith("StateDirectory") and str(data_dir) != DEFAULT_DATA_DIR):
            lines.append(line)
    return "\n".join(lines) + "\n"


def _unit_template() -> str:
    return (resources.files("roles") / "systemd" / UNIT_NAME).read_text()


def _check_hubs(hubs: tuple[str, ...], *, allow_plain_ws: bool) -> None:
    if not hubs:
        raise JoinError("--hub is required: the wss:// URL of the cloud hubs (repeat it for several)")
    for url in hubs:
        if url.startswith("ws://") and not allow_plain_ws:
            raise JoinError(
                f"hub {url} is plain ws://: the node's token would cross the network unencrypted;"
                " use wss:// (or --allow-plain-ws on a network you trust)"
            )


def _read_token(path: Path) -> bytes:
    try:
        token = path.read_bytes().strip()
    except OSError as exc:
        raise JoinError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    if not token:
        raise JoinError(f"the token file {path} is empty (`nodetaskd token create NODE` writes one)")
    return token + b"\n"


def _read_ca(path: Path) -> bytes:
    try:
        ssl.create_default_context(cafile=str(path))
        return path.read_bytes()
    except ssl.SSLError as exc:  # before OSError, which it is a subclass of
        raise JoinError(f"the CA file {path} holds no usable PEM certificate ({exc.reason})") from None
    except OSError as exc:
        raise JoinError(f"cannot read the CA file {path}: {exc.strerror or exc}") from None


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
) -> list[str]:
    """Install the agent's files for ``node`` under ``root``; returns what was done, a line each.

    Errors: :class:`JoinError` naming the bad input or the existing join, before anything is written.
    """
    layout = Layout(root)
    _check_hubs(hubs, allow_plain_ws=allow_plain_ws)
    token = _read_token(token_file)
    ca = _read_ca(ca_file) if ca_file is not None else None
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
            f"{root} already has an edge configuration ({layout.config}): run `nodetaskd edge reset` first,"
            " or give --force to overwrite it (the data directory is kept)"
        )

    files = [layout.config, layout.token, layout.unit, *([layout.ca] if ca is not None else [])]
    created = [d for d in (layout.config_dir, layout.data_dir) if not d.exists()]
    parents = [
        d
        for top in (layout.config_dir, layout.data_dir, layout.unit.parent)
        for d in (top, *top.parents)
        if d not in (layout.config_dir, layout.data_dir) and root in d.parents and not d.exists()
    ]
    previous = _load_record(layout) if force else None
    record = JoinRecord(
        node=node,
        files=tuple(sorted({str(f) for f in files} | set(previous.files if previous else ()))),
        directories=tuple(sorted({str(d) for d in created} | set(previous.directories if previous else ()))),
        parents=tuple(sorted({str(d) for d in parents} | set(previous.parents if previous else ()))),
    )
    done: list[str] = []
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
    unit = render_unit(_unit_template(), python=python, config=layout.config, data_dir=layout.data_dir)
    write_atomically(layout.unit, unit.encode(), mode=0o644)
    done.append(f"wrote the systemd unit {layout.unit} (ExecStart: {python} -m roles.edge.launcher)")
    done.append("start it: systemctl daemon-reload && systemctl enable --now nodetaskd-edge")
    return done


def _load_record(layout: Layout) -> JoinRecord | None:
    try:
        return msgspec.json.decode(layout.record.read_bytes(), type=JoinRecord)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:
        raise JoinError(f"cannot read {layout.record}: {exc}; remove what join wrote by hand") from None


def agent_running(data_dir: Path) -> bool:
    """Whether an agent answers on the control socket in ``data_dir`` (it is running)."""
    path = control_socket(data_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(2)
        try:
            conn.connect(str(path))
        except OSError:
            return False
    return True


def reset(*, root: Path) -> list[str]:
    """Remove what the join under ``root`` created; returns what was done, a line each.

    Errors: :class:`JoinError` while the agent still runs (stop it first), or when the record is unreadable.
    """
    layout = Layout(root)
    record = _load_record(layout)
    if record is None:
        return [f"nothing to reset: no join under {root} ({layout.record} does not exist)"]
    data_dir = layout.data_dir
    if agent_running(data_dir):
        raise JoinError(
            f"the edge agent of {record.node} is running (it answers on its control socket in {data_dir}):"
            " stop it first (systemctl disable --now nodetaskd-edge)"
        )
    done: list[str] = []
    for name in record.files:
        path = Path(name)
        if path.exists() or path.is_symlink():
            path.unlink()
            done.append(f"removed {path}")
    for name in sorted(record.directories, key=len, reverse=True):
        path = Path(name)
        if path.is_dir():
            shutil.rmtree(path)
            done.append(f"removed {path} and everything in it")
    layout.record.unlink(missing_ok=True)
    for name in sorted(record.parents, key=len, reverse=True):
        path = Path(name)
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    done.append(f"{record.node} is no longer joined here; run systemctl daemon-reload if the unit was loaded")
    return done
