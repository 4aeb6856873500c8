"""The package metadata gives ranges; constraints.txt the one version in each that is developed, tested and imaged."""

from __future__ import annotations

import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tools.provision.controlplane import REPO_ROOT


def _requirements() -> list[Requirement]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    listed = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return [r for r in map(Requirement, listed) if canonicalize_name(r.name) != "nodetaskd"]


def _constraints() -> dict[str, Version]:
    exact: dict[str, Version] = {}
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, separator, version = line.strip().partition("==")
            assert separator, f"constraints.txt: {line!r} is not name==version"
            exact[canonicalize_name(name)] = Version(version)
    return exact


@pytest.mark.parametrize("requirement", _requirements(), ids=str)
def test_each_dependency_is_a_bounded_range_holding_its_constrained_version(requirement: Requirement) -> None:
    """No exact pin in the metadata: a lower and an upper bound, and constraints.txt's version lies between them."""
    operators = {spec.operator for spec in requirement.specifier}
    assert operators == {">=", "<"}, f"{requirement}: wanted >=X,<Y"
    exact = _constraints().get(canonicalize_name(requirement.name))
    assert exact is not None, f"constraints.txt names no version of {requirement.name}"
    assert requirement.specifier.contains(exact, prereleases=True), (
        f"{requirement.name}=={exact} is outside {requirement}"
    )
