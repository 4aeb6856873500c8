"""The ``file.tail`` collector: the last lines of a file, only under the directories the device's config lists.

Closed by default (``diagnosis.tailDirs`` is empty): a Task may not read the device's files unless
its owner says where. The requested path is made absolute with its symbolic links resolved before
the check, so a link inside an allowed directory cannot lead out of it; the file is then opened
without following links, checked to be a regular file, and checked to be the file that was
resolved (``/proc/self/fd``), so that swapping a directory for a link between check and open is
caught too.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from typing import Final

import anyio.to_thread

from roles.edge.processors.outcome import MAX_VALUE_CHARS, ProcessorOutcome, failed
from roles.edge.processors.request_keys import RequestError, int_key, required_key

__all__ = ["LINES_KEY", "PATH_KEY", "allowed_path", "last_lines", "run_tail"]

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


def _read_tail(path: str, dirs: tuple[str, ...], n: int) -> ProcessorOutcome:
    resolved = os.path.realpath(path)
    real_dirs = tuple(os.path.realpath(d) for d in dirs)
    if not allowed_path(resolved, real_dirs):
        return failed(
            f"{PATH_KEY} {path!r} (resolved: {resolved!r}) is not under any directory of diagnosis.tailDirs"
            " of this device's config"
        )
    try:
        fd = os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return failed(f"{PATH_KEY} {resolved!r} cannot be opened: {exc.strerror or exc}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return failed(f"{PATH_KEY} {resolved!r} is not a regular file")
        if os.readlink(f"/proc/self/fd/{fd}") != resolved:
            return failed(f"{PATH_KEY} {resolved!r} changed while it was opened")
        start = max(0, info.st_size - _READ_BYTES)
        data = os.pread(fd, _READ_BYTES, start)
    except OSError as exc:
        return failed(f"{PATH_KEY} {resolved!r} cannot be read: {exc.strerror or exc}")
    finally:
        os.close(fd)
    lines = last_lines(data, n, whole=start == 0)
    return ProcessorOutcome(
        succeeded=True,
        results={
            "file.tail.path": resolved,
            "file.tail.size": str(info.st_size),
            "file.tail.lineCount": str(len(lines)),
            "file.tail.content": "\n".join(lines),
        },
    )


async def run_tail(request: Mapping[str, str], dirs: tuple[str, ...]) -> ProcessorOutcome:
    """The last ``file.tail.lines`` (default 100) lines of ``file.tail.path``, if ``dirs`` allows it."""
    if not dirs:
        return failed("file.tail is off on this device: diagnosis.tailDirs of its config lists no directory")
    path = required_key(request, PATH_KEY)
    if not path.startswith("/"):
        raise RequestError(f"{PATH_KEY} {path[:200]!r} is not an absolute path")
    n = int_key(request, LINES_KEY, default=100, low=1, high=10_000)
    return await anyio.to_thread.run_sync(_read_tail, path, dirs, n)
