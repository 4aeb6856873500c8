"""The ``file.tail`` collector: the last lines of a file, only under the directories the device's config lists.

Closed by default (``diagnosis.tailDirs`` is empty): a Task may not read the device's files unless
its owner says where. The requested path is made absolute with its symbolic links resolved before
the check, so a link inside an allowed directory cannot lead out of it. The resolved path is then
opened one directory at a time from ``/``, following no link: a directory swapped for a link (or
anything else) between the check and the open fails the Task, naming the path, instead of being
followed out. The file must be a regular file with one link: a hard link in an allowed directory
to a file elsewhere would otherwise carry that file's content in (a log file has one name).
Whatever the path holds (a NUL byte, undecodable text, a race), the Task fails with a reason;
nothing raises out of the collector.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Final

import anyio.to_thread

from roles.edge.processors.outcome import MAX_VALUE_CHARS, ProcessorOutcome, failed
from roles.edge.processors.request_keys import RequestError, int_key, required_key

__all__ = ["LINES_KEY", "PATH_KEY", "PathChanged", "allowed_path", "last_lines", "open_resolved", "run_tail"]

PATH_KEY: Final = "file.tail.path"
LINES_KEY: Final = "file.tail.lines"
_READ_BYTES: Final = MAX_VALUE_CHARS
"""The most bytes read from the file's end: what one result value holds."""


def allowed_path(resolved: str, dirs: Sequence[str]) -> bool:
    """Whether the resolved path ``resolved`` is inside one of the (resolved) directories ``dirs``."""
    return any(resolved != d and os.path.commonpath([resolved, d]) == d for d in dirs)


def last_lines(data: bytes, n: int, *, whole: bool) -> list[str]:
    """The last ``n`` lines of ``data`` (the end of a file); unless ``whole``, its first line may be cut, so it
    is dropped when more than ``n`` lines are not there to choose from."""
    lines = data.decode("utf-8", errors="replace").splitlines()
    if not whole and lines and len(lines) <= n:
        lines = lines[1:]
    return lines[-n:] if n else []


class PathChanged(Exception):
    """A directory on a resolved path has become a link since the path was resolved; args: that directory."""


def open_resolved(resolved: str) -> int:
    """Open the file at ``resolved`` (absolute, free of links when it was resolved) for reading, one
    component at a time from ``/``, following no link; its file descriptor.

    Errors: :class:`PathChanged` naming the directory that has become a link; :class:`OSError` as opening
    fails otherwise.
    """
    *directories, name = resolved.split("/")[1:]
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        walked = ""
        for directory in directories:
            walked += f"/{directory}"
            try:
                inner = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(directory, fd):
                    raise PathChanged(walked) from None
                raise
            os.close(fd)
            fd = inner
        try:
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PathChanged(resolved) from None
            raise
    finally:
        os.close(fd)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _allowed(path: str, dirs: tuple[str, ...]) -> str | ProcessorOutcome:
    """``path`` resolved, if it is under one of ``dirs`` (resolved too); a failure saying why not otherwise."""
    try:
        resolved = os.path.realpath(path)
        real_dirs = tuple(os.path.realpath(d) for d in dirs)
    except OSError as exc:
        # A link swapped for something else while it was being read ends the resolution so.
        return failed(f"{PATH_KEY} {path!r} cannot be resolved (did it change meanwhile?): {exc.strerror or exc}")
    if not allowed_path(resolved, real_dirs):
        return failed(
            f"{PATH_KEY} {path!r} (resolved: {resolved!r}) is not under any directory of diagnosis.tailDirs"
            " of this device's config"
        )
    return resolved


def _tail_of(fd: int, resolved: str, n: int) -> ProcessorOutcome:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return failed(f"{PATH_KEY} {resolved!r} is not a regular file")
    if info.st_nlink > 1:
        return failed(
            f"{PATH_KEY} {resolved!r} has {info.st_nlink} hard links: one of them may lie outside"
            " diagnosis.tailDirs, so file.tail reads only files with a single link"
        )
    start = max(0, info.st_size - _READ_BYTES)
    lines = last_lines(os.pread(fd, _READ_BYTES, start), n, whole=start == 0)
    return ProcessorOutcome(
        succeeded=True,
        results={
            "file.tail.path": resolved,
            "file.tail.size": str(info.st_size),
            "file.tail.lineCount": str(len(lines)),
            "file.tail.content": "\n".join(lines),
        },
    )


def _read_tail(path: str, dirs: tuple[str, ...], n: int) -> ProcessorOutcome:
    resolved = _allowed(path, dirs)
    if isinstance(resolved, ProcessorOutcome):
        return resolved
    try:
        fd = open_resolved(resolved)
    except PathChanged as exc:
        return failed(f"{PATH_KEY} {resolved!r} changed while it was opened: {exc.args[0]!r} has become a link")
    except OSError as exc:
        return failed(f"{PATH_KEY} {resolved!r} cannot be opened: {exc.strerror or exc}")
    try:
        return _tail_of(fd, resolved, n)
    except OSError as exc:
        return failed(f"{PATH_KEY} {resolved!r} cannot be read: {exc.strerror or exc}")
    finally:
        os.close(fd)


async def run_tail(request: Mapping[str, str], dirs: tuple[str, ...]) -> ProcessorOutcome:
    """The last ``file.tail.lines`` (default 100) lines of ``file.tail.path``, if ``dirs`` allows it."""
    if not dirs:
        return failed("file.tail is off on this device: diagnosis.tailDirs of its config lists no directory")
    path = required_key(request, PATH_KEY)
    if not path.startswith("/"):
        raise RequestError(f"{PATH_KEY} {path[:200]!r} is not an absolute path")
    if "\x00" in path:
        raise RequestError(f"{PATH_KEY} {path[:200]!r} holds a NUL byte, which no path can")
    try:
        os.fsencode(path)
    except UnicodeError:
        raise RequestError(f"{PATH_KEY} {path[:200]!r} is not a file name this device can spell") from None
    n = int_key(request, LINES_KEY, default=100, low=1, high=10_000)
    return await anyio.to_thread.run_sync(_read_tail, path, dirs, n)
