"""``nodetaskd edge reset``: undo what ``nodetaskd edge join`` installed on a device.

Reset removes only the paths join writes, computed from the root it is given (resolved,
:mod:`roles.cli.join_layout`): the record says which of those the join created, never where they are,
so a record naming any other path changes nothing. It never follows a symbolic link out of the root
(a data directory that is a link loses the link, never its target), goes on past a removal that fails
(naming it, and keeping the record for a second run), and removes the configuration directory only
once nothing join did not write is left in it. Base install only: this runs on the device.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from roles.cli.join_layout import JoinError, Layout, ResetError, load_record
from roles.edge.config_update.pending import pending_path
from roles.edge.control import control_socket

__all__ = ["agent_running", "reset"]


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
    record = load_record(layout)
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
