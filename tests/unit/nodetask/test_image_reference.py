"""The image reference grammar (nodetask.image_reference) accepts what distribution/reference does, and only that."""

from __future__ import annotations

import re

import pytest

from nodetask import image_reference


@pytest.mark.parametrize(
    ("reference", "ok"),
    [
        ("busybox", True),
        ("busybox:latest", True),
        ("library/busybox", True),
        ("ghcr.io/org/app:1.0", True),
        ("localhost:5000/a/b_c__d--e.f", True),
        ("[::1]:5000/app", True),
        ("app@sha256:" + "f" * 64, True),
        ("reg.example.com/app:v1@sha256:" + "0" * 64, True),
        ("app:" + "t" * 128, True),
        ("app:" + "t" * 129, False),
        ("Busybox", False),
        ("busybox:", False),
        ("busybox:.tag", False),
        ("busy box", False),
        ("app/", False),
        ("a__-b", False),
        ("-reg.io/app", False),
        ("app@sha256:abc", False),
        ("app:tág", False),
        ("", False),
    ],
)
def test_a_whole_reference_follows_the_grammar(reference: str, ok: bool) -> None:
    """Domain, lowercase path, tag of at most 128 and digest of 32+ hex digits; ASCII only, nothing else."""
    assert (image_reference.REFERENCE.fullmatch(reference) is not None) is ok


@pytest.mark.parametrize(
    ("pattern", "text", "ok"),
    [
        (image_reference.DOMAIN, "registry.example.com:5000", True),
        (image_reference.DOMAIN, "[fe80::1]", True),
        (image_reference.DOMAIN, "-bad.example.com", False),
        (image_reference.DOMAIN, "reg:port", False),
        (image_reference.PATH, "library/nginx", True),
        (image_reference.PATH, "Library/nginx", False),
        (image_reference.PATH, "library//nginx", False),
        (image_reference.TAG, "v1.2_3-rc", True),
        (image_reference.TAG, "-v1", False),
        (image_reference.DIGEST, "sha256:" + "a" * 64, True),
        (image_reference.DIGEST, "sha256:" + "a" * 31, False),
        (image_reference.IMAGE_ID, "0" * 64, True),
        (image_reference.IMAGE_ID, "0" * 63, False),
    ],
)
def test_each_part_follows_its_rule(pattern: re.Pattern[str], text: str, ok: bool) -> None:
    """The parts a parse checks one by one (host, path, tag, digest, bare image ID) follow the same grammar."""
    assert (pattern.fullmatch(text) is not None) is ok
