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
``--allow-plain-ws``; an existing join is never overwritten without ``--force``. The token and CA
files must be regular files of a bounded size (a FIFO would hang the join, ``/dev/zero`` fill its
memory), and the token must look like one (:mod:`roles.cli.token_format`), so that no other file is
installed and sent to the hubs as the node's token. The root may hold no control characters, and
the paths written into the unit are quoted by systemd's rules, so no path can add a line to it.

Reset removes only the paths join writes, computed from the root it is given (resolved): the record
says which of those the join created, never where they are, so a record naming any other path
changes nothing. It never follows a symbolic link out of the root (a data directory that is a link
loses the link, never its target), goes on past a removal that fails (naming it, and keeping the
record for a second run), and removes the configuration directory only once nothing join did not
write is left in it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import ssl
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

import msgspec

from roles.cli.token_format import token_problem
from roles.common.config import EdgeConfig
from roles.common.files import write_atomically
from roles.edge.config_update.pending import pending_path
from roles.edge.control import control_socket

__all__ = [
    "JoinError",
    "Layout",
    "ResetError",
    "join",
    "path_problem",
    "render_unit",
    "reset",
    "systemd_command",
    "systemd_path",
]

UNIT_NAME: Final = "nodetaskd-edge.service"
DEFAULT_DATA_DIR: Final = "/var/lib/nodetaskd"
MAX_TOKEN_FILE_BYTES: Final = 4096
"""A token file holds one line of at most 1,024 characters (``roles.cli.token_format``); anything larger is not one."""
MAX_CA_FILE_BYTES: Final = 1 << 20
"""A CA bundle of a few hundred certificates; a file larger than this is not the hubs' CA."""
_PEM_CERTIFICATE: Final = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)
_SAFE_WORD: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./+:,=-")
"""Characters a word of a unit's command line may hold unquoted."""


class JoinError(ValueError):
    """The join or reset cannot go ahead; the message names what is wrong and what would allow it."""


class ResetError(JoinError):
    """Reset removed what it could and failed on the rest (named); the record stays, so running it again retries."""

    def __init__(self, message: str, done: list[str]) -> None:
        super().__init__(message)
        self.done = done


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

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file join writes, and the one the agent leaves beside its configuration during an update."""
        return (self.config, self.token, self.ca, self.unit, pending_path(self.config))

    @property
    def parents(self) -> tuple[Path, ...]:
        """The directories above the config and data directories and the unit, up to (not including) the root."""
        found: list[Path] = []
        for top in (self.config_dir, self.data_dir, self.unit.parent):
            for directory in (top, *top.parents):
                if self.root in directory.parents and directory not in (self.config_dir, self.data_dir, *found):
                    found.append(directory)
        return tuple(found)


class JoinRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What a join created: reset removes these (those of them that are paths join writes) and nothing else."""

    node: str
    files: tuple[str, ...]
    directories: tuple[str, ...] = ()
    """Created by the join, removed by reset (the data directory whole: it holds the agent's store)."""
    parents: tuple[str, ...] = ()
    """Directories above those that the join created; reset removes them when they are empty."""


def path_problem(path: str) -> str:
    """What keeps ``path`` out of a systemd unit or a configuration line; empty if nothing.

    A control character (a newline above all) would start a new line of the unit, and a path that is
    not UTF-8 cannot be written into it at all.
    """
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in path):
        return "holds a control character (a newline would add a line to the systemd unit)"
    try:
        path.encode()
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return ""


def systemd_command(argv: Sequence[str]) -> str:
    """``argv`` as the value of a unit's ``ExecStart``, each word quoted by systemd's rules when it needs it.

    Inside double quotes systemd undoes C escapes (so ``\\`` and ``"`` are escaped) and ``%`` starts
    a specifier (``%%`` is one ``%``); in the arguments, not the program, ``$`` starts an environment
    variable (``$$`` is one ``$``).
    """
    words = []
    for index, word in enumerate(argv):
        if word and set(word) <= _SAFE_WORD:
            words.append(word)
            continue
        escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        if index:
            escaped = escaped.replace("$", "$$")
        words.append(f'"{escaped}"')
    return " ".join(words)


def systemd_path(path: Path) -> str:
    """An absolute ``path`` as a unit's ``WorkingDirectory``: systemd expands only specifiers there."""
    return str(path).replace("%", "%%")


def render_unit(template: str, *, python: str, config: Path, data_dir: Path) -> str:
    """The packaged unit with this installation's interpreter, configuration and data directory.

    ``StateDirectory`` (which makes systemd create ``/var/lib/nodetaskd``) stays only when the data
    directory is that one.

    Errors: :class:`JoinError` naming a path that holds a control character (checked again here,
    whoever the caller: a newline would add a line to the unit).
    """
    for what, path in (("the interpreter's path", python), ("the configuration's path", str(config))):
        if problem := path_problem(path) or ("" if path.startswith("/") else "is not absolute"):
            raise JoinError(f"{what} {path!r} {problem}")
    if any(c in python for c in "\"'\\"):
        raise JoinError(f"the interpreter's path {python!r} holds a quote or backslash: systemd starts no such program")
    if problem := path_problem(str(data_dir)):
        raise JoinError(f"the data directory {str(data_dir)!r} {problem}")
    lines = []
    for line in template.splitlines():
        if line.startswith("ExecStart="):
            command = (python, "-m", "roles.edge.launcher", "--config", str(config))
            lines.append(f"ExecStart={systemd_command(command)}")
        elif line.startswith("WorkingDirectory="):
            lines.append(f"WorkingDirectory={systemd_path(data_dir)}")
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


def _read_ca(path: Path) -> bytes:
    """The CA file's content, once its certificates load; copied whole, as the agent's TLS reads the copy."""
    data = _read_input(path, "the CA file", MAX_CA_FILE_BYTES)
    # Only the certificate blocks are checked (a bundle's comments may be in any script): the
    # ssl module takes PEM from memory only as ASCII text.
    blocks = _PEM_CERTIFICATE.findall(data)
    try:
        if not blocks:
            raise ValueError("no certificate block")
        ssl.create_default_context(cadata=b"\n".join(blocks).decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise JoinError(f"the CA file {path} holds no usable PEM certificate ({reason})") from None
    return data


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
) -> list[str]:
    """Install the agent's files for ``node`` under ``root``; returns what was done, a line each.

    Errors: :class:`JoinError` naming the bad input or the existing join, before anything is written.
    """
    layout = Layout(_checked_root(root))
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
            f"{layout.root} already has an edge configuration ({layout.config}): run `nodetaskd edge reset` first,"
            " or give --force to overwrite it (the data directory is kept)"
        )
    unit = render_unit(_unit_template(), python=python, config=layout.config, data_dir=layout.data_dir)

    files = [layout.config, layout.token, layout.unit, *([layout.ca] if ca is not None else [])]
    created = [d for d in (layout.config_dir, layout.data_dir) if not d.exists()]
    parents = [d for d in layout.parents if not d.exists()]
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


def _out_of(root: Path, path: Path) -> Path | None:
    """Where ``path``'s directory really is, when a symbolic link on the way takes it out of ``root``; else None."""
    real = path.parent.resolve()
    return None if real == root or root in real.parents else real


def _spelt(record: tuple[str, ...], known: dict[str, Path]) -> tuple[list[Path], list[str]]:
    """The known paths ``record`` names, and the entries that name none of them."""
    named = [known[os.path.normpath(entry)] for entry in record if os.path.normpath(entry) in known]
    return named, [entry for entry in record if os.path.normpath(entry) not in known]


def _known(root: Path, resolved: Layout, paths: tuple[Path, ...]) -> dict[str, Path]:
    """``paths`` (of ``resolved``'s layout) by how a record may spell them: under the root as given, or resolved."""
    spellings = {str(p): p for p in paths}
    given = Path(os.path.abspath(root))
    if given != resolved.root:
        spellings |= {str(given / p.relative_to(resolved.root)): p for p in paths}
    return spellings


@dataclass(slots=True)
class _Removal:
    """What reset did and what it failed to do, inside ``root`` only."""

    root: Path
    done: list[str]
    failed: list[str]

    def outside(self, path: Path) -> bool:
        """Whether ``path`` is reached through a link out of the root (then it is kept, and said so)."""
        if (real := _out_of(self.root, path)) is None:
            return False
        self.done.append(f"kept {path}: it lies in {real}, out of {self.root}, through a symbolic link")
        return True

    def remove(self, path: Path, action: str, remove: Callable[[Path], object]) -> None:
        try:
            remove(path)
        except OSError as exc:
            self.failed.append(f"{path}: {exc.strerror or exc}")
        else:
            self.done.append(action)

    def file(self, path: Path) -> None:
        if self.outside(path) or not (path.is_symlink() or path.exists()):
            return
        if path.is_dir() and not path.is_symlink():
            self.done.append(f"kept {path}: a directory, where join wrote a file")
        else:
            self.remove(path, f"removed {path}", Path.unlink)

    def data_dir(self, path: Path) -> None:
        if self.outside(path):
            return
        if path.is_symlink():
            target = os.readlink(path)
            self.remove(path, f"removed the link {path} (kept {target}, which it points to)", Path.unlink)
        elif path.is_dir():
            self.remove(path, f"removed {path} and everything in it", shutil.rmtree)

    def empty_dir(self, path: Path, *, say: bool) -> None:
        """Remove the directory ``path`` if nothing is left in it (``say``: else say what is)."""
        if _out_of(self.root, path) is not None or path.is_symlink() or not path.is_dir():
            return
        left = sorted(p.name for p in path.iterdir())
        if not left:
            self.remove(path, f"removed {path}", Path.rmdir)
        elif say:
            self.done.append(f"kept {path}: it holds what join did not write ({', '.join(left)})")


def reset(*, root: Path) -> list[str]:
    """Remove what the join under ``root`` created; returns what was done (and what was kept, and why), a line each.

    Only the paths join writes under ``root`` are candidates, and only those the record says the
    join created are removed: the data directory whole (it is the agent's), the configuration
    directory once nothing else is in it. Nothing is followed out of the root: a file or directory
    reached through a symbolic link that leads out of it is kept, and a data directory that is itself
    a link loses the link only.

    Errors: :class:`JoinError` while the agent still runs (stop it first), or when the record is
    unreadable, before anything is removed; :class:`ResetError` when a removal failed (the others
    are done, the record is kept, so running reset again retries).
    """
    layout = Layout(root.resolve())
    record = _load_record(layout)
    if record is None:
        return [f"nothing to reset: no join under {layout.root} ({layout.record} does not exist)"]
    if agent_running(layout.data_dir):
        raise JoinError(
            f"the edge agent of {record.node} is running (it answers on its control socket in {layout.data_dir}):"
            " stop it first (systemctl disable --now nodetaskd-edge)"
        )
    files, stray_files = _spelt(record.files, _known(root, layout, layout.files))
    if layout.config in files:
        files.append(pending_path(layout.config))  # the agent's note beside the configuration join wrote
    directories, stray = _spelt(record.directories, _known(root, layout, (layout.config_dir, layout.data_dir)))
    parents, stray_parents = _spelt(record.parents, _known(root, layout, layout.parents))
    removal = _Removal(
        root=layout.root,
        done=[
            f"ignored {entry}: {layout.record} names it, but join writes nothing there"
            for entry in (*stray_files, *stray, *stray_parents)
        ],
        failed=[],
    )
    for path in dict.fromkeys(files):
        removal.file(path)
    if layout.data_dir in directories:
        removal.data_dir(layout.data_dir)
    if removal.failed:
        raise ResetError(
            f"could not remove {'; '.join(removal.failed)}; {layout.record} is kept: run `nodetaskd edge reset` again",
            removal.done,
        )
    if not removal.outside(layout.record):
        layout.record.unlink(missing_ok=True)
    if layout.config_dir in directories:
        removal.empty_dir(layout.config_dir, say=True)
    for path in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        removal.empty_dir(path, say=False)
    if removal.failed:  # only directories left empty can be left now: nothing to run again for
        raise ResetError(f"could not remove {'; '.join(removal.failed)}", removal.done)
    removal.done.append(f"{record.node} is no longer joined here; run systemctl daemon-reload if the unit was loaded")
    return removal.done
