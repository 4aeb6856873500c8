"""Which version nodetaskd says it is: the package metadata, else a checkout's pyproject.toml."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from roles.common.version import UNKNOWN, checkout_version, package_version


def test_an_installed_package_says_its_metadata_version(tmp_path: Path) -> None:
    """The installed distribution's version wins over whatever a checkout's pyproject.toml says."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "nodetaskd"\nversion = "9.9.9"\n')
    assert package_version(checkout=tmp_path) == importlib.metadata.version("nodetaskd")


def test_a_checkout_never_installed_says_its_pyproject_version(tmp_path: Path) -> None:
    """Without metadata for the distribution, the version comes from the checkout's pyproject.toml."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "not-installed-here"\nversion = "1.2.3"\n')
    assert package_version(distribution="not-installed-here", checkout=tmp_path) == "1.2.3"


@pytest.mark.parametrize(
    "content",
    [
        None,
        '[project]\nname = "another"\nversion = "1.0"\n',
        '[project]\nname = "nodetaskd"\n',
        "[project\n",
        '[tool.other]\nversion = "1.0"\n',
    ],
)
def test_a_tree_that_names_no_nodetaskd_version_says_unknown(tmp_path: Path, content: str | None) -> None:
    """No pyproject.toml, another project's, one without a version or not TOML at all: the version is unknown."""
    if content is not None:
        (tmp_path / "pyproject.toml").write_text(content)
    assert checkout_version(tmp_path) == UNKNOWN
