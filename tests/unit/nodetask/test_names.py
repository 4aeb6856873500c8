"""Node and job names are checked exactly as Kubernetes checks them, and outside text is shown clipped."""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodetask.names import MAX_SUBDOMAIN, InvalidName, check_object_name, clip, event_name, object_name_problem

label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
subdomains = st.lists(label, min_size=1, max_size=4).map(".".join)


@pytest.mark.parametrize(
    "name",
    ["edge-1", "a", "0", "edge.zone-a.example", "a" * MAX_SUBDOMAIN, "1-2-3", "x" + ".y" * 100],
)
def test_kubernetes_node_names_are_accepted(name: str) -> None:
    """Lower-case alphanumerics with inner '-' and '.', up to 253 characters, pass."""
    assert object_name_problem(name) == ""
    assert check_object_name(name, what="node name") == name


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "must not be empty"),
        ("a" * (MAX_SUBDOMAIN + 1), "no more than 253 characters (it has 254)"),
        ("x/../../../../../../healthz", "RFC 1123 subdomain"),
        ("x/../../../kube-system/secrets/token", "RFC 1123 subdomain"),
        ("edge-1#x", "RFC 1123 subdomain"),
        ("edge-1?x", "RFC 1123 subdomain"),
        ("edge-1/", "RFC 1123 subdomain"),
        ("..", "RFC 1123 subdomain"),
        (".", "RFC 1123 subdomain"),
        ("a..b", "RFC 1123 subdomain"),
        (".a", "RFC 1123 subdomain"),
        ("a.", "RFC 1123 subdomain"),
        ("-a", "RFC 1123 subdomain"),
        ("a-", "RFC 1123 subdomain"),
        ("a.-b", "RFC 1123 subdomain"),
        ("Edge-1", "RFC 1123 subdomain"),
        ("edge_1", "RFC 1123 subdomain"),
        ("edge%2D1", "RFC 1123 subdomain"),
        ("x%2F..%2F..", "RFC 1123 subdomain"),
        ("édge", "RFC 1123 subdomain"),
        ("edge\n", "RFC 1123 subdomain"),
        ("edge 1", "RFC 1123 subdomain"),
        ("edge\x00", "RFC 1123 subdomain"),
    ],
)
def test_anything_else_is_refused_saying_why(name: str, problem: str) -> None:
    """Path tricks, fragments, upper case, empty or over-long names are refused with the reason."""
    assert problem in object_name_problem(name)
    with pytest.raises(InvalidName, match="node name"):
        check_object_name(name, what="node name")


@given(subdomains)
def test_generated_subdomains_pass(name: str) -> None:
    """Every dot-joined sequence of DNS labels (here at most 91 characters) is a valid name."""
    assert object_name_problem(name) == ""


@given(st.text(max_size=300))
def test_a_valid_name_is_one_plain_path_segment(name: str) -> None:
    """Whatever passes needs no quoting and cannot be '.', '..' or hold '/', '?', '#' or '%'."""
    if object_name_problem(name):
        return
    assert urllib.parse.quote(name, safe="") == name
    assert name not in (".", "..")
    assert len(name) <= MAX_SUBDOMAIN


def test_an_error_for_a_huge_name_stays_small() -> None:
    """A 1 MB name is named in the error by its first characters and its length only."""
    with pytest.raises(InvalidName) as refused:
        check_object_name("x" * 1_000_000, what="node name")
    assert len(str(refused.value)) < 512
    assert "1000000" in str(refused.value)


def test_clip_keeps_short_text_and_says_how_long_long_text_was() -> None:
    """Short text is unchanged; long text keeps its first characters and its length."""
    assert clip("short") == "short"
    assert clip("y" * 300, 10) == "yyyyyyyyyy... (300 characters)"


def test_a_key_fixes_the_name_and_no_key_gives_a_new_one() -> None:
    """The same key gives the same name, another key another; without one every name differs; all fit in 253."""
    assert event_name("job", "uid", "7", "x") == event_name("job", "uid", "7", "x")
    assert event_name("job", "uid", "7", "x") != event_name("job", "uid", "8", "x")
    assert event_name("job") != event_name("job")
    assert event_name("j" * 253, "k").startswith("j" * 240 + ".")
    assert len(event_name("j" * 253, "k")) <= 253
