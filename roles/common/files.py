"""Replacing files and links so that a reader, or a crash, sees the old content or the new, never half.

Each write goes to a fresh temporary name in the target's directory, is synced, renamed over the
target, and then the directory is synced so the rename itself survives a power cut. Used by the
edge (upgrade marker, ``current`` link, configuration) and by the cloud (serving certificates):
standard library only, so the edge's base install can import it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

NEW_FILE_MODE = 0o600
"""A new file's mode when the caller names none: private, since these files hold keys and configuration."""


def write_atomically(path: Path, data: bytes, *, mode: int | None = None, replace: bool = True) -> None:
    """Replace ``path`` with ``data``; ``mode`` None keeps the existing file's mode (0o600 for a new file).

    The mode is set before the data is written, so a key is never readable by others, even briefly.
    Without ``replace`` an existing ``path`` is left as it is and :class:`FileExistsError` raised.
    """
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = NEW_FILE_MODE
    with _replacing(path, replace=replace) as (fd, _), os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), mode)
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def copy_atomically(source: Path, path: Path, *, mode: int) -> None:
    """Replace ``path`` with a copy of ``source`` (an executable being swapped, a backup being kept)."""
    with _replacing(path) as (fd, _), os.fdopen(fd, "wb") as out, source.open("rb") as src:
        os.fchmod(out.fileno(), mode)
        while chunk := src.read(1 << 20):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())


def link_atomically(path: Path, target: str) -> None:
    """Point the symbolic link ``path`` at ``target``, replacing whatever ``path`` was."""
    with _replacing(path) as (fd, temporary):
        # mkstemp cannot make a link: its unique name is taken over by one.
        os.close(fd)
        os.unlink(temporary)
        os.symlink(target, temporary)


@contextlib.contextmanager
def _replacing(path: Path, *, replace: bool = True) -> Iterator[tuple[int, str]]:
    """A fresh temporary file next to ``path``, renamed over it when the block ends without error
    (without ``replace``, linked to it: that fails if ``path`` exists, whatever made it in between)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        yield fd, temporary
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
            os.unlink(temporary)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Make the renames and links done in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
