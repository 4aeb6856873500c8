"""API paths quote every part, so no name, namespace or subresource can change which object is requested."""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from roles.kube.resources import NODES, SECRETS, TASKS

HOST = "https://127.0.0.1:6443"


def requested(path: str) -> list[str]:
    """The decoded segments of the path the API client sends (aiohttp builds its URL with yarl)."""
    raw = URL(HOST + path).raw_path
    return [urllib.parse.unquote(segment) for segment in raw.split("/")[1:]]


@pytest.mark.parametrize("name", ["edge-1#x", "edge-1?watch=true", "a b", "edge-1;x", "ünïcode", "edge-1\n"])
def test_a_hostile_name_stays_one_segment_of_the_path(name: str) -> None:
    """The segments, as the client sends them, are the resource's own and then the name itself."""
    assert requested(NODES.path(name)) == ["api", "v1", "nodes", name]
    assert requested(SECRETS.path(name, namespace="kube-system")) == [
        "api",
        "v1",
        "namespaces",
        "kube-system",
        "secrets",
        name,
    ]


@pytest.mark.parametrize(
    "name",
    [
        ".",
        "..",
        "x/../../../../../../healthz",
        "x/../../../default/secrets/stolen",
        "edge-1/status",
        "edge-1/",
        "x%2F..%2F..",
        "%2e%2e",
    ],
)
def test_names_no_path_segment_can_carry_are_refused(name: str) -> None:
    """Dot segments (resolved by the client) and '/' or '%' (decoded by the API server) are refused."""
    with pytest.raises(ValueError, match="cannot be an API path segment"):
        NODES.path(name)
    with pytest.raises(ValueError, match="cannot be an API path segment"):
        SECRETS.path("x", namespace=name)
    with pytest.raises(ValueError, match="cannot be an API path segment"):
        SECRETS.path("x", namespace="default", subresource=name)


@given(name=st.text(min_size=1), namespace=st.text(min_size=1), subresource=st.text(min_size=1))
def test_any_parts_map_to_exactly_their_own_segments(name: str, namespace: str, subresource: str) -> None:
    """For any text, the request names that namespace, that object and that subresource, or is refused."""
    parts = (name, namespace, subresource)
    try:
        path = SECRETS.path(name, namespace=namespace, subresource=subresource)
    except ValueError:
        assert any(p in (".", "..") or "/" in p or "%" in p for p in parts)
        return
    assert requested(path) == ["api", "v1", "namespaces", namespace, "secrets", name, subresource]


def test_ordinary_names_are_unchanged() -> None:
    """Valid object names need no quoting, so the paths the hub always used stay as they were."""
    assert NODES.path("edge-1.zone-a") == "/api/v1/nodes/edge-1.zone-a"
    assert SECRETS.path("nodetaskd-edge-e1", namespace="kube-system", subresource="status") == (
        "/api/v1/namespaces/kube-system/secrets/nodetaskd-edge-e1/status"
    )


def test_a_namespaced_collection_without_namespace_spans_all_namespaces() -> None:
    """Listing or watching Tasks across namespaces has a path; naming one object still needs its namespace."""
    assert TASKS.path() == "/apis/diagnosis.kubediag.org/v1/tasks"
    assert TASKS.path(namespace="default") == "/apis/diagnosis.kubediag.org/v1/namespaces/default/tasks"
    for name, subresource in (("t", ""), ("t", "status"), ("", "status")):
        with pytest.raises(ValueError, match="tasks are namespaced: a namespace is required"):
            TASKS.path(name, subresource=subresource)
