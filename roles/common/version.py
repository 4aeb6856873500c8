"""Which nodetaskd this is: ``nodetaskd --version`` and the ``nodetaskd_build_info`` gauge say it.

The installed package's metadata is the answer. Source code run from a checkout that was never installed
(``python -m roles.cli`` with the tree on ``sys.path``) has none: its ``pyproject.toml`` says the version
instead. Stdlib only, so that the edge's base install may use it too.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path
from typing import Final

__all__ = ["DISTRIBUTION", "UNKNOWN", "package_version"]

DISTRIBUTION: Final = "nodetaskd"
UNKNOWN: Final = "unknown"
"""What is said when neither the metadata nor a checkout's ``pyproject.toml`` names the version."""

_CHECKOUT: Final = Path(__file__).resolve().parents[2]
"""The directory holding the ``roles`` package: a checkout's root when run from one."""


def package_version(*, distribution: str = DISTRIBUTION, checkout: Path = _CHECKOUT) -> str:
    """The version of the installed ``distribution``, else the one ``checkout/pyproject.toml`` gives it."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return checkout_version(checkout, distribution=distribution)


def checkout_version(checkout: Path, *, distribution: str = DISTRIBUTION) -> str:
    """The version ``checkout/pyproject.toml`` gives ``distribution``; :data:`UNKNOWN` when it gives none
    (no such file, another project's, unreadable)."""
    try:
        project = tomllib.loads((checkout / "pyproject.toml").read_text()).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return UNKNOWN
    version = project.get("version")
    if project.get("name") != distribution or not isinstance(version, str):
        return UNKNOWN
    return version
