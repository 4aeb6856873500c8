"""Resource versions compared: which copy of an object a cache keeps, and when a copy is the same one again."""

from __future__ import annotations

import pytest

from roles.kube.versions import fresher, newer


@pytest.mark.parametrize(
    ("new", "old", "is_fresher", "is_newer"),
    [
        ("12", "11", True, True),
        ("11", "12", False, False),
        ("12", "12", True, False),  # the same copy: a watch's echo of one's own write
        ("12", "", True, True),  # not comparable: the later arrival wins
        ("", "12", True, True),
        ("", "", True, True),
        ("x", "x", True, False),
    ],
)
def test_a_copy_replaces_an_older_one_and_only_a_different_one_is_newer(
    new: str, old: str, is_fresher: bool, is_newer: bool
) -> None:
    """``fresher`` lets any copy not older replace another; ``newer`` also refuses the same version again."""
    assert (fresher(new, old), newer(new, old)) == (is_fresher, is_newer)
