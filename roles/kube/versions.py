"""Resource versions compared: the API server's are etcd revisions, decimal integers, so a cache can tell
which of two copies of an object is newer (a write's answer may arrive after a newer watch event)."""

from __future__ import annotations

__all__ = ["fresher", "newer", "revision"]


def revision(resource_version: str) -> int:
    """``resource_version`` as a number; -1 when it is not one (older than any real revision)."""
    try:
        return int(resource_version)
    except ValueError:
        return -1


def fresher(new: str, old: str) -> bool:
    """Whether a copy at ``new`` may replace one at ``old``: not older, or not comparable (then the later
    arrival wins, as without versions)."""
    try:
        return int(new) >= int(old)
    except ValueError:
        return True


def newer(new: str, old: str) -> bool:
    """Whether a copy at ``new`` may replace one at ``old`` and is not the same copy again: as :func:`fresher`,
    less an equal version (a watch's echo of one's own write, or the answer to a write that changed nothing)."""
    if new and new == old:
        return False
    return fresher(new, old)
