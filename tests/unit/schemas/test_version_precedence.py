"""The order of versions a kubelet upgrade compares (Semantic Versioning's precedence)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.version_rule import is_version, precedence

SEMVER_EXAMPLE = [
    "v1.0.0-alpha",
    "v1.0.0-alpha.1",
    "v1.0.0-alpha.beta",
    "v1.0.0-beta",
    "v1.0.0-beta.2",
    "v1.0.0-beta.11",
    "v1.0.0-rc.1",
    "v1.0.0",
    "v1.20.2",
    "v1.20.3-nodetaskd.1",
    "v1.20.3",
    "v1.100.0",
]


def test_the_semver_specifications_example_is_in_order() -> None:
    """semver.org's own list (pre-releases before their release, numbers compared as numbers), and ours."""
    assert sorted(reversed(SEMVER_EXAMPLE), key=precedence) == SEMVER_EXAMPLE


@given(st.tuples(*[st.integers(0, 10**4)] * 3), st.tuples(*[st.integers(0, 10**4)] * 3))
def test_releases_order_as_their_numbers(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    """Without pre-releases, precedence is the order of (major, minor, patch) as integers."""
    first, second = (f"v{x}.{y}.{z}" for x, y, z in (a, b))
    assert (precedence(first) < precedence(second)) is (a < b)


@given(st.from_regex(r"v[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(-[a-zA-Z0-9_.]{1,8})?", fullmatch=True))
def test_every_accepted_version_has_a_precedence(version: str) -> None:
    """What the webhook accepts, the device can compare."""
    assert is_version(version)
    assert precedence(version)[:3] == tuple(int(p) for p in version[1:].split("-", maxsplit=1)[0].split("."))


@pytest.mark.parametrize("version", ["1.20.2", "v1.20", "latest", ""])
def test_a_malformed_version_is_named(version: str) -> None:
    """The error quotes the value."""
    with pytest.raises(ValueError, match=repr(version)):
        precedence(version)
